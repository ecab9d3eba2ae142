//! `browser_step`'s backend: Debian's Chromium, headless, in a sandbox of
//! its own per session, driven over the DevTools pipe.

pub mod cdp;
pub mod session;
pub mod trace;

pub use session::{Clicked, Ended, Filled, Launch, Loaded, OpenFailed, Session, VM_MIN_MEMORY};
