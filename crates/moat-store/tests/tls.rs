#![allow(clippy::expect_used, clippy::unwrap_used)]
//! TLS to PostgreSQL against a real server: a PostgreSQL of the test's own
//! (initdb in a temporary directory, `ssl=on` with a certificate made here,
//! listening on a loopback port, refusing every connection without TLS),
//! reached with each `sslmode`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use moat_store::{Store, StoreError};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority of the test's own.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca {
        pem,
        issuer: Issuer::new(params, key),
    }
}

/// A server certificate for `localhost` (and no address) from `ca`: the
/// certificate's and the key's PEM.
fn server_cert(ca: &Ca) -> (String, String) {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The newest PostgreSQL server programs Debian installed.
fn pg_bin() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect(
            "PostgreSQL's server programs are needed (Debian's postgresql package: \
             bash tests/suite.sh installs it)",
        )
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(Path::file_name)
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().expect("no /usr/lib/postgresql/*/bin/initdb")
}

fn as_postgres(program: &Path) -> Command {
    let mut command = Command::new("runuser");
    command
        .args(["-u", "postgres", "--"])
        .arg(program)
        .current_dir("/");
    command
}

/// A throwaway PostgreSQL with TLS only, on a loopback port; stopped and
/// removed when dropped.
struct TlsServer {
    dir: tempfile::TempDir,
    port: u16,
    ca_file: PathBuf,
}

impl TlsServer {
    fn start() -> TlsServer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let owned = Command::new("chown")
            .arg("postgres:postgres")
            .arg(&data)
            .status()
            .unwrap();
        assert!(owned.success(), "chown postgres {}", data.display());
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
        let bin = pg_bin();
        let initdb = as_postgres(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "root", "--auth=trust", "-E", "UTF8"])
            .output()
            .expect("running initdb as postgres");
        assert!(
            initdb.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        let authority = ca("Moat store test CA");
        let (cert, key) = server_cert(&authority);
        std::fs::write(data.join("server.crt"), cert).unwrap();
        std::fs::write(data.join("server.key"), key).unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &authority.pem).unwrap();
        // Only TLS over TCP (the server's socket and log stay in its directory).
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all moat_pw 127.0.0.1/32 scram-sha-256\n\
             hostssl all all 127.0.0.1/32 trust\n\
             hostnossl all all 127.0.0.1/32 reject\n",
        )
        .unwrap();
        let chown = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(data.join("server.crt"))
            .arg(data.join("server.key"))
            .arg(data.join("pg_hba.conf"))
            .status()
            .unwrap();
        assert!(chown.success());
        std::fs::set_permissions(
            data.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={port} -k {} -c ssl=on -c fsync=off",
            data.display()
        );
        let started = as_postgres(&bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(data.join("server.log"))
            .args(["-w", "-o", &options, "start"])
            .output()
            .expect("running pg_ctl");
        assert!(
            started.status.success(),
            "pg_ctl start: {}{}",
            String::from_utf8_lossy(&started.stderr),
            std::fs::read_to_string(data.join("server.log")).unwrap_or_default()
        );
        TlsServer { dir, port, ca_file }
    }

    /// `sql` through the server's unix socket, as root.
    fn psql(&self, sql: &str) {
        let out = Command::new("psql")
            .arg(format!(
                "host={} port={} user=root dbname=postgres",
                self.dir.path().join("data").display(),
                self.port
            ))
            .args(["-v", "ON_ERROR_STOP=1", "-qc", sql])
            .output()
            .expect("running psql");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A connection string to the server's `postgres` database as root.
    fn url(&self, host: &str, tls: &str) -> String {
        format!(
            "host={host} port={} user=root dbname=postgres {tls}",
            self.port
        )
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = as_postgres(&pg_bin().join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

fn refused(result: Result<Store, StoreError>, what: &str) -> String {
    match result {
        Ok(_) => panic!("{what}: connected"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn each_sslmode_connects_as_libpq_would_and_refuses_what_it_cannot_trust() {
    let server = TlsServer::start();
    let ca_file = server.ca_file.display().to_string();

    // Verified, name and all: the store opens, migrates and works.
    let store = Store::open(&server.url(
        "localhost",
        &format!("sslmode=verify-full sslrootcert={ca_file}"),
    ))
    .expect("verify-full with the server's CA");
    let org = store.create_org("acme", "hash-acme", 1).expect("an org");
    assert!(org.starts_with("org_"), "{org}");
    drop(store);

    // The same as a URL.
    Store::open(&format!(
        "postgres://root@localhost:{}/postgres?sslmode=verify-full&sslrootcert={ca_file}",
        server.port
    ))
    .expect("verify-full as a URL");

    // The certificate names localhost, not 127.0.0.1: verify-full refuses
    // the address, verify-ca (the chain only) takes it.
    let e = refused(
        Store::open(&server.url(
            "127.0.0.1",
            &format!("sslmode=verify-full sslrootcert={ca_file}"),
        )),
        "verify-full by address",
    );
    assert!(
        e.to_lowercase().contains("not valid for name") || e.contains("NotValidForName"),
        "{e}"
    );
    Store::open(&server.url(
        "127.0.0.1",
        &format!("sslmode=verify-ca sslrootcert={ca_file}"),
    ))
    .expect("verify-ca by address");

    // Another CA's certificate is not this one's.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, ca("Another CA").pem).unwrap();
    let e = refused(
        Store::open(&server.url(
            "localhost",
            &format!("sslmode=verify-full sslrootcert={}", other.display()),
        )),
        "verify-full with another CA",
    );
    assert!(
        e.contains("UnknownIssuer") || e.to_lowercase().contains("unknown issuer"),
        "{e}"
    );

    // require: encrypted, the certificate unchecked (libpq's meaning).
    Store::open(&server.url("localhost", "sslmode=require")).expect("require");

    // Over the server's unix socket there is no TLS, whatever sslmode says
    // (as with libpq).
    Store::open(&format!(
        "host={} port={} user=root dbname=postgres sslmode=require",
        server.dir.path().join("data").display(),
        server.port
    ))
    .expect("require over a unix socket");

    // Without TLS the server refuses (its pg_hba.conf), and says why.
    let e = refused(
        Store::open(&server.url("localhost", "sslmode=disable")),
        "disable",
    );
    assert!(e.contains("no encryption"), "{e}");

    // What cannot be honoured is refused before any connection.
    for bad in [
        "sslmode=verify-full",
        "sslmode=sometimes",
        "sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
    ] {
        let e = refused(Store::open(&server.url("localhost", bad)), bad);
        assert!(e.starts_with("TLS to PostgreSQL:"), "{bad}: {e}");
    }
}

#[test]
fn a_password_given_apart_from_the_url_logs_in_and_is_never_taken_twice() {
    let server = TlsServer::start();
    // A role that must give a password (SCRAM), with a database of its own.
    server.psql("CREATE ROLE moat_pw LOGIN PASSWORD 'p@ss w0rd''s'");
    server.psql("CREATE DATABASE moat_pw OWNER moat_pw");
    let url = format!(
        "host=localhost port={} user=moat_pw dbname=moat_pw sslmode=verify-full sslrootcert={}",
        server.port,
        server.ca_file.display()
    );
    let store = Store::open_with_password(&url, Some("p@ss w0rd's")).expect("the right password");
    store.create_org("acme", "hash-acme", 1).expect("an org");
    drop(store);

    let e = refused(
        Store::open_with_password(&url, Some("wrong")),
        "a wrong password",
    );
    assert!(e.contains("password authentication failed"), "{e}");

    // Once only: in the URL and apart is refused before connecting.
    let e = refused(
        Store::open_with_password(&format!("{url} password=other"), Some("p@ss w0rd's")),
        "two passwords",
    );
    assert!(e.starts_with("database options:"), "{e}");
    // A SQLite file takes none.
    let dir = tempfile::tempdir().unwrap();
    let e = refused(
        Store::open_with_password(
            &format!("sqlite:{}", dir.path().join("m.db").display()),
            Some("x"),
        ),
        "sqlite with a password",
    );
    assert!(e.contains("SQLite"), "{e}");
}
