#![allow(clippy::expect_used, clippy::unwrap_used)]
//! The host's block of ids for sandboxes: the first root launch records it
//! in /etc/subuid and /etc/subgid, once, whatever the concurrency, beside
//! the entries already there; entries that disagree, a chosen block that
//! takes another owner's ids and an account bearing Moat's owner name are
//! refused. Every test runs in a private mount namespace over a copy of
//! /etc: the real files are never written.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::MOAT;
use serde_json::Value;

/// Runs `script` with `sh` in a private mount namespace where /etc is a
/// copy (`etc`): what moat writes there never reaches the real files.
fn with_private_etc(etc: &Path, script: &str) -> Output {
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-euc"])
        .arg(format!("mount --bind '{}' /etc\n{script}", etc.display()))
        .env_remove("MOAT_UID_RANGE")
        .env("MOAT", MOAT)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn the_first_root_launch_records_moats_block_in_subuid_and_subgid_once() {
    let real = |f| std::fs::read(f).ok();
    let before = (real("/etc/subuid"), real("/etc/subgid"));
    let dir = tempfile::tempdir().unwrap();
    let etc = dir.path().join("etc");
    let copied = Command::new("cp")
        .arg("-a")
        .arg("/etc")
        .arg(&etc)
        .status()
        .unwrap();
    assert!(copied.success());
    // Someone already holds the first block in subuid; subgid is private.
    std::fs::write(etc.join("subuid"), "alice:1879048192:65536\n").unwrap();
    std::fs::write(etc.join("subgid"), "").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(etc.join("subgid"), std::fs::Permissions::from_mode(0o640)).unwrap();

    // Four first launches at once agree on one block.
    let out = with_private_etc(
        &etc,
        r#"for i in 1 2 3 4; do "$MOAT" exec --json -- /bin/true > /tmp/moat-subid-$$-$i & done
           wait
           for i in 1 2 3 4; do cat /tmp/moat-subid-$$-$i; echo; rm /tmp/moat-subid-$$-$i; done"#,
    );
    let block = 1879048192 + 65536;
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
    {
        let doc: Value = serde_json::from_str(line).unwrap();
        let e = &doc["report"]["enforcement"];
        let uid = e["hostUid"].as_u64().unwrap();
        assert!((block..block + 65536).contains(&uid), "{e}");
        let detail = e["hostIdentity"]["detail"].as_str().unwrap();
        assert!(detail.contains("/etc/subuid"), "{detail}");
    }
    let entry = format!("moat-sandboxes:{block}:65536\n");
    assert_eq!(
        std::fs::read_to_string(etc.join("subuid")).unwrap(),
        format!("alice:1879048192:65536\n{entry}")
    );
    assert_eq!(std::fs::read_to_string(etc.join("subgid")).unwrap(), entry);
    let mode = std::fs::metadata(etc.join("subgid"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o640, "subgid's mode was not kept");

    // Entries that disagree are refused, with the reason.
    std::fs::write(etc.join("subgid"), "moat-sandboxes:1900000000:65536\n").unwrap();
    let out = with_private_etc(
        &etc,
        r#"if "$MOAT" exec -- /bin/true 2>/tmp/moat-subid-$$; then exit 1; fi
           cat /tmp/moat-subid-$$; rm /tmp/moat-subid-$$"#,
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("the `moat-sandboxes` entries differ"),
        "{said}"
    );

    // A chosen block may not take another owner's subordinate ids, and no
    // account may bear the owner's name (the entry would let it map them).
    let refused = |script: &str, says: &str| {
        let out = with_private_etc(
            &etc,
            &format!(
                r#"if "$MOAT" exec {script} -- /bin/true 2>/tmp/moat-subid-$$; then exit 1; fi
                   cat /tmp/moat-subid-$$; rm /tmp/moat-subid-$$"#
            ),
        );
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(said.contains(says), "{script}: {said}");
    };
    refused(
        "--uid-range 1879048200:10",
        "alice's ids 1879048192+65536 in /etc/subuid",
    );
    let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
    std::fs::write(
        etc.join("passwd"),
        format!("{passwd}moat-sandboxes:x:4444:4444::/nonexistent:/usr/sbin/nologin\n"),
    )
    .unwrap();
    refused(
        "--uid-range 1895825408:10",
        "an account named `moat-sandboxes`",
    );

    assert_eq!(
        (real("/etc/subuid"), real("/etc/subgid")),
        before,
        "the real files changed"
    );
}
