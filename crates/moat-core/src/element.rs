//! What an acting browser step (`click`, `type`, `select`, `fill_secret`)
//! would act on, as the runner's browser found it: the facts the policy
//! decides on, and their fingerprint, which binds a decision (or a
//! person's approval) to that element on that page.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A capability's `element` that binds no element: issued by hand with
/// `moat capability issue --element any`, never by the control plane.
pub const ANY_ELEMENT: &str = "any";

/// The element a step would act on. Every field is the page's to make up
/// (but `origin`, the page's own): each is cut short by the browser, and
/// none holds a field's value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ElementFacts {
    /// The page's origin (`https://shop.example`).
    pub origin: String,
    /// The page's address, cut to 2 KiB: the approval of a step on one
    /// page is not one on another page of the site.
    pub url: String,
    /// Lower case: `button`, `a`, `input`...
    pub tag: String,
    /// Its `type` attribute (`submit`, `password`...), or empty.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its `role` attribute, or empty.
    pub role: String,
    /// Its visible text, cut to 200 characters.
    pub text: String,
    /// A link's target, or empty.
    pub href: String,
    /// Its form's method (`get`, `post`, `dialog`), or empty outside a form.
    pub form_method: String,
    /// Its form's action URL, or empty outside a form.
    pub form_action: String,
    /// Whether clicking it submits its form (a submit button or image).
    pub submits: bool,
}

impl ElementFacts {
    /// `sha256:` and the hex SHA-256 of the facts' canonical JSON.
    pub fn fingerprint(&self) -> String {
        // Strings and a bool always serialise; the Debug form is a
        // stand-in that still tells any two apart.
        let hex = crate::hash::canonical_hash(self)
            .unwrap_or_else(|_| crate::hash::sha256_hex(format!("{self:?}").as_bytes()));
        format!("sha256:{hex}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_changes_with_any_fact() {
        let button = ElementFacts {
            origin: "http://Shop.test:8080".into(),
            tag: "button".into(),
            kind: "submit".into(),
            text: "Pay".into(),
            form_method: "post".into(),
            form_action: "http://shop.test:8080/pay".into(),
            submits: true,
            ..ElementFacts::default()
        };
        assert!(button.fingerprint().starts_with("sha256:"));
        let other = ElementFacts {
            text: "Pay now".into(),
            ..button.clone()
        };
        assert_ne!(button.fingerprint(), other.fingerprint());
        assert_eq!(button.fingerprint(), button.clone().fingerprint());
    }
}
