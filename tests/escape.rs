//! Filesystem escapes: a sandboxed program cannot reach, read or modify
//! anything on the host but the roots it was given, and those only as the mode
//! allows. Each test plants a canary with a random name and checks it after.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::*;

#[test]
fn path_traversal_out_of_the_workspace_reaches_nothing_on_the_host() {
    let canary = Canary::plant();
    let ws = workspace();
    let target = canary.path.display().to_string();
    let script = format!(
        "cat /workspace/../..{target} /workspace/../../../..{target}; \
         echo pwned > /workspace/../../..{target}; ls /workspace/../../..",
    );
    let run = exec(
        &["--workspace", path_str(ws.path())],
        &["/bin/sh", "-c", &script],
    );
    assert!(!run.stdout.contains(&canary.content), "{}", run.stdout);
    assert!(
        run.stderr.contains("No such file or directory"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("workspace") && !run.stdout.contains("home"),
        "{}",
        run.stdout
    );
    canary.assert_intact();
    assert_all_layers_enforced(&run);
}

#[test]
fn symlinks_in_the_workspace_cannot_point_outside_it() {
    let canary = Canary::plant();
    let ws = workspace();
    std::os::unix::fs::symlink(&canary.path, ws.path().join("file-link")).unwrap();
    std::os::unix::fs::symlink(canary.dir.path(), ws.path().join("dir-link")).unwrap();
    let name = canary.path.file_name().unwrap().to_str().unwrap();
    let script = format!(
        "cat /workspace/file-link; cat /workspace/dir-link/{name}; \
         echo pwned > /workspace/file-link; echo pwned > /workspace/dir-link/{name}; \
         ln -s /proc/self/root/.. /workspace/up && cat /workspace/up{}",
        canary.path.display()
    );
    let run = exec(
        &["--workspace", path_str(ws.path())],
        &["/bin/sh", "-c", &script],
    );
    assert_ne!(run.code, 0);
    assert!(!run.stdout.contains(&canary.content), "{}", run.stdout);
    canary.assert_intact();
    assert_all_layers_enforced(&run);
}

#[test]
fn absolute_host_paths_are_invisible_in_the_minimal_root() {
    let canary = Canary::plant();
    let ws = workspace();
    // /root, when it is there (the evidence layer listening), is the
    // sandbox's decoy home: empty files where credentials usually are, that
    // Landlock refuses. Never the host's.
    let script = format!(
        "for p in /etc/shadow /home /run /sys {} {}; do \
           if [ -e \"$p\" ]; then echo \"VISIBLE $p\"; fi; done; cat /etc/shadow; \
         if [ -e /root ]; then echo \"home: $(ls -A /root | tr '\\n' ' ')\"; \
           find /root -type f -size +0 | sed 's/^/FULL /'; fi",
        canary.path.display(),
        canary.dir.path().display()
    );
    let run = exec(
        &["--workspace", path_str(ws.path())],
        &["/bin/sh", "-c", &script],
    );
    assert!(!run.stdout.contains("VISIBLE"), "{}", run.stdout);
    assert!(!run.stdout.contains("root:"), "{}", run.stdout);
    assert!(!run.stdout.contains("FULL"), "{}", run.stdout);
    if run.stdout.contains("home:") {
        assert_eq!(run.layer("evidence"), "enforced", "{}", run.report);
        assert!(
            run.stdout.contains(
                "home: .aws .config .docker .git-credentials .kube .netrc .npmrc .pgpass .pypirc .ssh \n"
            ),
            "{}",
            run.stdout
        );
    }
    canary.assert_intact();
    assert_all_layers_enforced(&run);
}

#[test]
fn host_ro_root_masks_credentials_and_private_tmp() {
    let in_tmp = Canary::plant_in("/tmp");
    let in_var = Canary::plant();
    let script = format!(
        "cat /etc/shadow; ls -A /root; ls -A /run; cat {tmp}; cat {var}; \
         echo pwned > {var} || echo VAR-READONLY; \
         test -r /etc/passwd && echo PASSWD-READABLE; touch /etc/moat-{t} || echo ETC-READONLY",
        tmp = in_tmp.path.display(),
        var = in_var.path.display(),
        t = token()
    );
    let run = exec(&["--root", "host-ro"], &["/bin/sh", "-c", &script]);
    assert!(run.stdout.contains("PASSWD-READABLE"), "{}", run.stdout);
    assert!(run.stdout.contains("ETC-READONLY"), "{}", run.stdout);
    assert!(run.stdout.contains("VAR-READONLY"), "{}", run.stdout);
    assert!(
        !run.stdout.contains("root:"),
        "shadow leaked: {}",
        run.stdout
    );
    // The host is visible read-only, but /tmp is the sandbox's own.
    assert!(run.stdout.contains(&in_var.content), "{}", run.stdout);
    assert!(!run.stdout.contains(&in_tmp.content), "{}", run.stdout);
    in_tmp.assert_intact();
    in_var.assert_intact();
    assert_eq!(run.report["enforcement"]["rootView"], "host-ro");
    assert_all_layers_enforced(&run);
}

#[test]
fn declared_roots_must_not_go_through_symlinks() {
    let canary = Canary::plant();
    let ws = workspace();
    let link = ws.path().join("escape");
    std::os::unix::fs::symlink(canary.dir.path(), &link).unwrap();
    for flag in ["--workspace", "--output", "--rw"] {
        let output = std::process::Command::new(MOAT)
            .args(["exec", flag, path_str(&link), "--", "/bin/true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains("symbolic link"), "{stderr}");
    }
    // A nested mount point is never created through a symlink either.
    let inner = workspace();
    let output = std::process::Command::new(MOAT)
        .args(["exec", "--workspace", path_str(ws.path())])
        .arg("--ro")
        .arg(format!(
            "{}:/workspace/escape/planted",
            path_str(inner.path())
        ))
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    canary.assert_intact();
}

#[test]
fn a_nested_file_root_leaves_the_outer_roots_file_untouched() {
    let ws = workspace();
    std::fs::write(ws.path().join("config"), "original\n").unwrap();
    let replacement = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(replacement.path(), "replacement\n").unwrap();
    let bind = format!("{}:/workspace/config", replacement.path().display());
    let run = exec(
        &["--workspace", path_str(ws.path()), "--ro", &bind],
        &["/bin/cat", "/workspace/config"],
    );
    assert_eq!(run.stdout, "replacement\n", "{}", run.stderr);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("config")).unwrap(),
        "original\n"
    );
}

#[test]
fn writes_outside_writable_roots_fail_and_change_nothing() {
    let ws = workspace();
    let input = workspace();
    let before = std::fs::read_dir(input.path()).unwrap().count();
    let tag = token();
    let script = format!(
        "for p in /usr/{tag} /etc/{tag} /{tag} /proc/{tag} /dev/{tag} /workspace/input/{tag}; do \
           if echo x > \"$p\" 2>/dev/null; then echo \"WROTE $p\"; fi; done; \
         echo ok > /workspace/allowed && echo WORKSPACE-WRITABLE"
    );
    let run = exec(
        &[
            "--workspace",
            path_str(ws.path()),
            "--input",
            path_str(input.path()),
        ],
        &["/bin/sh", "-c", &script],
    );
    assert!(!run.stdout.contains("WROTE"), "{}", run.stdout);
    assert!(run.stdout.contains("WORKSPACE-WRITABLE"), "{}", run.stdout);
    assert_eq!(std::fs::read_dir(input.path()).unwrap().count(), before);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("allowed")).unwrap(),
        "ok\n"
    );
    for host in ["/usr", "/etc", "/"] {
        assert!(!std::path::Path::new(host).join(&tag).exists());
    }
    assert_all_layers_enforced(&run);
}

#[test]
fn read_only_mode_makes_the_workspace_read_only() {
    let ws = workspace();
    let out = workspace();
    let run = exec(
        &[
            "--mode",
            "read-only",
            "--workspace",
            path_str(ws.path()),
            "--output",
            path_str(out.path()),
        ],
        &[
            "/bin/sh",
            "-c",
            "cat /workspace/hello.txt; echo x > /workspace/new || echo WS-DENIED; \
             echo x > /workspace/output/new || echo OUT-DENIED",
        ],
    );
    assert!(run.stdout.contains("hello"), "{}", run.stdout);
    assert!(run.stdout.contains("WS-DENIED") && run.stdout.contains("OUT-DENIED"));
    assert!(!ws.path().join("new").exists());
    assert!(!out.path().join("new").exists());
    assert_all_layers_enforced(&run);
}

#[test]
fn set_id_files_cannot_be_made_in_a_writable_root() {
    let ws = workspace();
    let mut args = with_probe();
    args.extend(["--workspace".into(), path_str(ws.path()).into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for check in ["setuid-file", "create-setuid"] {
        let name = format!("{check}-{}", token());
        let run = exec(
            &args,
            &["/probe/probe", check, &format!("/workspace/{name}")],
        );
        assert_eq!(
            run.stdout.trim(),
            "errno=1",
            "{check}: {} {}",
            run.stdout,
            run.stderr
        );
        let syscall = if check == "setuid-file" {
            "fchmod"
        } else {
            "openat"
        };
        run.assert_syscall_denied_event(syscall);
        if let Ok(meta) = std::fs::metadata(ws.path().join(&name)) {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(meta.permissions().mode() & 0o6000, 0, "{check}");
        }
    }
}

/// The same attacks from inside a `microvm` guest, where they apply (not
/// the host-ro view or a file as a root, which the class refuses, nor the
/// symbolic-link checks on declared roots, made before any class).
mod in_a_microvm {
    macro_rules! again {
        ($($name:ident),+ $(,)?) => {
            $(#[test]
            fn $name() {
                super::in_microvm(super::$name);
            })+
        };
    }

    again!(
        path_traversal_out_of_the_workspace_reaches_nothing_on_the_host,
        symlinks_in_the_workspace_cannot_point_outside_it,
        absolute_host_paths_are_invisible_in_the_minimal_root,
        writes_outside_writable_roots_fail_and_change_nothing,
        read_only_mode_makes_the_workspace_read_only,
        set_id_files_cannot_be_made_in_a_writable_root,
    );
}
