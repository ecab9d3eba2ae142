//! The WIT a worker is built against (`wit/`: Moat's `moat:worker`
//! package and the WASI 0.2 interfaces it includes), carried in the
//! binaries so `moat worker build` needs no checkout.

use std::path::Path;

/// The world a worker targets: `wasi:cli/run` plus Moat's bindings.
pub const WORLD: &str = "moat:worker/command";

/// Every file of `wit/`, by its path under it.
pub const FILES: &[(&str, &str)] = &[
    (
        "deps/cli/command.wit",
        include_str!("../wit/deps/cli/command.wit"),
    ),
    (
        "deps/cli/environment.wit",
        include_str!("../wit/deps/cli/environment.wit"),
    ),
    (
        "deps/cli/exit.wit",
        include_str!("../wit/deps/cli/exit.wit"),
    ),
    (
        "deps/cli/imports.wit",
        include_str!("../wit/deps/cli/imports.wit"),
    ),
    ("deps/cli/run.wit", include_str!("../wit/deps/cli/run.wit")),
    (
        "deps/cli/stdio.wit",
        include_str!("../wit/deps/cli/stdio.wit"),
    ),
    (
        "deps/cli/terminal.wit",
        include_str!("../wit/deps/cli/terminal.wit"),
    ),
    (
        "deps/clocks/monotonic-clock.wit",
        include_str!("../wit/deps/clocks/monotonic-clock.wit"),
    ),
    (
        "deps/clocks/timezone.wit",
        include_str!("../wit/deps/clocks/timezone.wit"),
    ),
    (
        "deps/clocks/wall-clock.wit",
        include_str!("../wit/deps/clocks/wall-clock.wit"),
    ),
    (
        "deps/clocks/world.wit",
        include_str!("../wit/deps/clocks/world.wit"),
    ),
    (
        "deps/filesystem/preopens.wit",
        include_str!("../wit/deps/filesystem/preopens.wit"),
    ),
    (
        "deps/filesystem/types.wit",
        include_str!("../wit/deps/filesystem/types.wit"),
    ),
    (
        "deps/filesystem/world.wit",
        include_str!("../wit/deps/filesystem/world.wit"),
    ),
    (
        "deps/io/error.wit",
        include_str!("../wit/deps/io/error.wit"),
    ),
    ("deps/io/poll.wit", include_str!("../wit/deps/io/poll.wit")),
    (
        "deps/io/streams.wit",
        include_str!("../wit/deps/io/streams.wit"),
    ),
    (
        "deps/io/world.wit",
        include_str!("../wit/deps/io/world.wit"),
    ),
    (
        "deps/random/insecure-seed.wit",
        include_str!("../wit/deps/random/insecure-seed.wit"),
    ),
    (
        "deps/random/insecure.wit",
        include_str!("../wit/deps/random/insecure.wit"),
    ),
    (
        "deps/random/random.wit",
        include_str!("../wit/deps/random/random.wit"),
    ),
    (
        "deps/random/world.wit",
        include_str!("../wit/deps/random/world.wit"),
    ),
    (
        "deps/sockets/instance-network.wit",
        include_str!("../wit/deps/sockets/instance-network.wit"),
    ),
    (
        "deps/sockets/ip-name-lookup.wit",
        include_str!("../wit/deps/sockets/ip-name-lookup.wit"),
    ),
    (
        "deps/sockets/network.wit",
        include_str!("../wit/deps/sockets/network.wit"),
    ),
    (
        "deps/sockets/tcp-create-socket.wit",
        include_str!("../wit/deps/sockets/tcp-create-socket.wit"),
    ),
    (
        "deps/sockets/tcp.wit",
        include_str!("../wit/deps/sockets/tcp.wit"),
    ),
    (
        "deps/sockets/udp-create-socket.wit",
        include_str!("../wit/deps/sockets/udp-create-socket.wit"),
    ),
    (
        "deps/sockets/udp.wit",
        include_str!("../wit/deps/sockets/udp.wit"),
    ),
    (
        "deps/sockets/world.wit",
        include_str!("../wit/deps/sockets/world.wit"),
    ),
    ("worker.wit", include_str!("../wit/worker.wit")),
];

/// Writes the WIT under `dir` (which must exist), as `wit/` is laid out.
pub fn write_to(dir: &Path) -> std::io::Result<()> {
    for (path, text) in FILES {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(file, text)?;
    }
    Ok(())
}
