//! `moat export`: the verifier in its sandbox over real files, as root and
//! unprivileged; only what passed is copied out, byte for byte.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

const RULES: &str = r#"{"rules":[
  {"path":"clean/*.csv","types":["csv"],"maxBytes":1000000,"csv":{"header":["id","amount"]}},
  {"path":"summary.json","types":["json"]},
  {"path":"archive/*","types":["gzip"]}
]}"#;

/// `moat export` over `dir`'s `out/` with `dir`'s `rules.json`, its
/// scratch directory under `dir/tmp`.
fn export(dir: &Path, extra: &[&str]) -> Output {
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    Command::new(common::MOAT)
        .env("TMPDIR", dir.join("tmp"))
        .arg("export")
        .arg("--rules")
        .arg(dir.join("rules.json"))
        .arg("--from")
        .arg(dir.join("out"))
        .args(extra)
        .output()
        .unwrap()
}

/// The verdicts of a run that rejected something (exit status 1).
fn verdicts(output: &Output) -> Vec<(String, String, Vec<String>)> {
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)));
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["verdict"].as_str().unwrap().to_owned(),
                f["reasons"]
                    .as_array()
                    .map(|r| {
                        r.iter()
                            .map(|r| r["rule"].as_str().unwrap().to_owned())
                            .collect()
                    })
                    .unwrap_or_default(),
            )
        })
        .collect()
}

/// What a data-cleaning job might leave: two good outputs and the rest.
fn job_outputs(dir: &Path) {
    let out = dir.join("out");
    std::fs::create_dir_all(out.join("clean")).unwrap();
    std::fs::create_dir_all(out.join("archive")).unwrap();
    std::fs::write(dir.join("rules.json"), RULES).unwrap();
    std::fs::write(
        dir.join("secrets.json"),
        r#"{"crm-token":"crm-7f3a9c2e11b04d5d"}"#,
    )
    .unwrap();
    std::fs::write(
        out.join("clean/customers.csv"),
        "id,amount\n1,10.50\n2,\"1,000\"\n",
    )
    .unwrap();
    std::fs::write(out.join("summary.json"), r#"{"rows":2,"dropped":0}"#).unwrap();
    std::fs::copy("/bin/true", out.join("clean/tool.csv")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", out.join("clean/passwd.csv")).unwrap();
    // Sparse: 200 MB that takes no disk.
    std::fs::File::create(out.join("clean/huge.csv"))
        .unwrap()
        .set_len(200 << 20)
        .unwrap();
    std::fs::write(
        out.join("clean/leak.csv"),
        "id,amount\n1,Y3JtLTdmM2E5YzJlMTFiMDRkNWQ\n",
    )
    .unwrap();
    std::fs::write(out.join("clean/ragged.csv"), "id,amount\n1,2,3\n").unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &vec![b'a'; 20 << 20]).unwrap();
    std::fs::write(out.join("archive/bomb.gz"), gz.finish().unwrap()).unwrap();
}

fn sha(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

#[test]
fn only_what_passes_is_copied_out_with_its_reasons_for_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    job_outputs(dir.path());
    let to = dir.path().join("trusted");
    let secrets = dir.path().join("secrets.json");
    let output = export(
        dir.path(),
        &[
            "--json",
            "--to",
            to.to_str().unwrap(),
            "--secrets",
            secrets.to_str().unwrap(),
        ],
    );
    let got = verdicts(&output);
    let expect = |path: &str, verdict: &str, rule: Option<&str>| {
        let (_, v, reasons) = got
            .iter()
            .find(|(p, ..)| p == path)
            .unwrap_or_else(|| panic!("{path} missing from {got:?}"));
        assert_eq!(v, verdict, "{path}: {reasons:?}");
        if let Some(rule) = rule {
            assert_eq!(reasons, &vec![rule.to_owned()], "{path}");
        }
    };
    expect("clean/customers.csv", "promoted", None);
    expect("summary.json", "promoted", None);
    expect("clean/tool.csv", "rejected", Some("executable"));
    expect("clean/passwd.csv", "rejected", Some("symlink"));
    expect("clean/huge.csv", "rejected", Some("too_large"));
    expect("clean/leak.csv", "rejected", Some("secret"));
    expect("clean/ragged.csv", "rejected", Some("invalid_content"));
    expect("archive/bomb.gz", "rejected", Some("archive_bomb"));
    assert_eq!(got.len(), 8, "{got:?}");

    // Exactly the two promoted files, byte for byte, and nothing else.
    let mut copied: Vec<String> = walk(&to);
    copied.sort();
    assert_eq!(copied, ["clean/customers.csv", "summary.json"]);
    for rel in copied {
        assert_eq!(
            sha(&to.join(&rel)),
            sha(&dir.path().join("out").join(&rel)),
            "{rel}"
        );
        let mode = std::fs::metadata(to.join(&rel))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o644, "{rel}");
    }
    // The verifier's scratch directory is gone.
    let left = std::fs::read_dir(dir.path().join("tmp")).unwrap().count();
    assert_eq!(left, 0, "scratch left behind");
}

fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out
}

#[test]
fn the_table_names_each_reason_and_the_exit_status_says_rejections() {
    let dir = tempfile::tempdir().unwrap();
    job_outputs(dir.path());
    let secrets = dir.path().join("secrets.json");
    let output = export(dir.path(), &["--secrets", secrets.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{table}");
    assert!(
        table.contains("executable: an executable (ELF) never leaves"),
        "{table}"
    );
    assert!(table.contains("symlink: a symbolic link"), "{table}");
    assert!(table.contains("2 promoted"), "{table}");
    assert!(table.contains("6 rejected"), "{table}");
}

#[test]
fn a_file_the_verifier_dies_on_is_rejected_and_the_others_still_judged() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("out/clean")).unwrap();
    std::fs::write(
        dir.path().join("rules.json"),
        r#"{"rules":[{"path":"clean/*.csv","types":["csv"],"maxBytes":209715200}]}"#,
    )
    .unwrap();
    // One field of 80 MB: more than the verifier's 32 MB can hold.
    let mut big = String::from("id,amount\n1,\"");
    big.push_str(&"x".repeat(80 << 20));
    big.push_str("\"\n");
    std::fs::write(dir.path().join("out/clean/b-huge.csv"), big).unwrap();
    std::fs::write(dir.path().join("out/clean/a.csv"), "id,amount\n1,2\n").unwrap();
    std::fs::write(dir.path().join("out/clean/c.csv"), "id,amount\n3,4\n").unwrap();
    let to = dir.path().join("trusted");
    let output = export(
        dir.path(),
        &["--memory", "32M", "--json", "--to", to.to_str().unwrap()],
    );
    let got = verdicts(&output);
    assert_eq!(
        got,
        [
            ("clean/a.csv".into(), "promoted".into(), vec![]),
            (
                "clean/b-huge.csv".into(),
                "rejected".into(),
                vec!["verifier_failed".into()]
            ),
            ("clean/c.csv".into(), "promoted".into(), vec![]),
        ],
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(
        report["files"][1]["reasons"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("out of its 32M of memory"),
        "{report}"
    );
    let mut copied = walk(&to);
    copied.sort();
    assert_eq!(copied, ["clean/a.csv", "clean/c.csv"]);
}

/// zip archives as Python's zipfile writes them (another writer than the
/// verifier's own tests): a plain one, a bomb, a symlink, a name that
/// climbs out, an executable inside, a zip inside a zip, and a
/// self-extracting stub in front.
const ZIPS: &str = r#"
import io, os, stat, sys, zipfile
out = sys.argv[1]
def make(name, members, prefix=b""):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in members:
            z.writestr(info, data)
    with open(os.path.join(out, name), "wb") as f:
        f.write(prefix + buf.getvalue())
    return buf.getvalue()
def entry(name, mode=0o644 | stat.S_IFREG):
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = mode << 16
    info.create_system = 3
    return info
plain = make("plain.zip", [(entry("report/a.csv"), b"id,total\n1,2\n"), (entry("notes.txt"), b"ok\n")])
make("bomb.zip", [(entry("zeros.txt"), b"0" * (64 << 20))])
make("link.zip", [(entry("passwd", 0o777 | stat.S_IFLNK), b"/etc/passwd")])
make("climb.zip", [(entry("../../.bashrc"), b"echo hi\n")])
make("tool.zip", [(entry("tool"), open("/usr/bin/true", "rb").read())])
make("nested.zip", [(entry("inner.zip"), plain)])
sfx = make("sfx-inner.zip", [(entry("a.txt"), b"a\n")])
os.remove(os.path.join(out, "sfx-inner.zip"))
with open(os.path.join(out, "sfx.zip"), "wb") as f:
    f.write(b"MZ" + b"\0" * 62 + sfx)
"#;

#[test]
fn zip_archives_leave_only_when_listed_and_every_entry_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    let made = Command::new("python3")
        .args(["-c", ZIPS])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    std::fs::write(
        dir.path().join("rules.json"),
        r#"{"rules":[{"path":"*.zip","types":["zip"],"maxBytes":209715200}]}"#,
    )
    .unwrap();
    let to = dir.path().join("trusted");
    let output = export(dir.path(), &["--json", "--to", to.to_str().unwrap()]);
    let got = verdicts(&output);
    let want = [
        ("bomb.zip", "rejected", "archive_bomb"),
        ("climb.zip", "rejected", "invalid_content"),
        ("link.zip", "rejected", "invalid_content"),
        ("nested.zip", "rejected", "invalid_content"),
        ("plain.zip", "promoted", ""),
        // The stub in front is what it is detected as.
        ("sfx.zip", "rejected", "executable"),
        ("tool.zip", "rejected", "invalid_content"),
    ];
    let report = String::from_utf8_lossy(&output.stdout);
    assert_eq!(got.len(), want.len(), "{report}");
    for ((path, verdict, reasons), (want_path, want_verdict, want_rule)) in got.iter().zip(want) {
        assert_eq!(
            (path.as_str(), verdict.as_str()),
            (want_path, want_verdict),
            "{report}"
        );
        let want_reasons: Vec<String> = match want_rule {
            "" => vec![],
            rule => vec![rule.to_owned()],
        };
        assert_eq!(reasons, &want_reasons, "{path}: {report}");
    }
    for (path, says) in [
        ("link.zip", "symlink"),
        ("climb.zip", "outside the archive"),
        ("tool.zip", "executable"),
        ("nested.zip", "nested archives"),
    ] {
        assert!(
            report.contains(says),
            "{path} should be refused for {says:?}: {report}"
        );
    }
    assert_eq!(walk(&to), ["plain.zip"]);

    // Without zip among the rule's types, none leaves.
    std::fs::write(
        dir.path().join("rules.json"),
        r#"{"rules":[{"path":"*.zip","types":["csv","gzip"]}]}"#,
    )
    .unwrap();
    let output = export(dir.path(), &["--json"]);
    assert!(
        verdicts(&output).iter().all(|(p, v, r)| v == "rejected"
            && (r == &["archive".to_owned()] || p == "sfx.zip" && r == &["executable".to_owned()])),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn bad_rules_and_paths_exit_2_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    for (rules, needle) in [
        (r#"{"rules":[]}"#, "no rules"),
        (
            r#"{"rules":[{"path":"/etc/*","types":["text"]}]}"#,
            "must be relative",
        ),
        (
            r#"{"rules":[{"path":"*","types":["elf"]}]}"#,
            "unknown variant",
        ),
        ("not json", "expected"),
    ] {
        std::fs::write(dir.path().join("rules.json"), rules).unwrap();
        let output = export(dir.path(), &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{rules}: {stderr}");
        assert!(stderr.starts_with("moat export: --rules"), "{stderr}");
        assert!(stderr.contains(needle), "{rules}: {stderr}");
    }
    std::fs::write(dir.path().join("rules.json"), RULES).unwrap();
    let output = Command::new(common::MOAT)
        .args(["export", "--rules"])
        .arg(dir.path().join("rules.json"))
        .args(["--from", "/nonexistent-moat-export"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--from /nonexistent-moat-export"));
}

#[test]
fn an_unprivileged_user_gets_the_same_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    job_outputs(dir.path());
    let to = dir.path().join("trusted");
    let tmp = dir.path().join("tmp");
    for d in [&to, &tmp] {
        std::fs::create_dir_all(d).unwrap();
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(common::MOAT)
        .arg("export")
        .arg("--rules")
        .arg(dir.path().join("rules.json"))
        .arg("--from")
        .arg(dir.path().join("out"))
        .arg("--secrets")
        .arg(dir.path().join("secrets.json"))
        .args(["--allow-degraded", "--json", "--to"])
        .arg(&to)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let got = verdicts(&output);
    let promoted: Vec<&str> = got
        .iter()
        .filter(|(_, v, _)| v == "promoted")
        .map(|(p, ..)| p.as_str())
        .collect();
    assert_eq!(promoted, ["clean/customers.csv", "summary.json"], "{got:?}");
    let mut copied = walk(&to);
    copied.sort();
    assert_eq!(copied, ["clean/customers.csv", "summary.json"]);
    assert!(walk(&tmp).is_empty(), "scratch left behind");
}
