//! A database written before versioned migrations (the `moat up --demo`
//! database of c477b39, in `tests/fixtures/`) upgrades in place on both
//! backends: every row is still there and readable, the event chain still
//! verifies and goes on growing, reopening changes nothing, and a database
//! newer than this build is refused.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use moat_store::{ApprovalState, NewOp, NewRun, OpState, RunState, Store, TempPostgres};

const SQLITE_FIXTURE: &str = include_str!("fixtures/unversioned.sqlite.sql");
const POSTGRES_FIXTURE: &str = include_str!("fixtures/unversioned.postgres.sql");

const ORG: &str = "org_465d140053966843622a1e4d84cab34b";
const RUNNER: &str = "runner_2be8bc95e63db0a2955810ec8370addc";

const TABLES: [&str; 18] = [
    "orgs",
    "tokens",
    "runs",
    "ops",
    "events",
    "ledger_head",
    "blobs",
    "artifacts",
    "runner_builds",
    "manifests",
    "revoked_keys",
    "runners",
    "approvals",
    "secrets",
    "tools",
    "tool_calls",
    "tool_tokens",
    "request_nonces",
];

/// Raw SQL on the database under test, outside the store.
trait Raw {
    fn batch(&mut self, sql: &str);
    fn count(&mut self, sql: &str) -> i64;
}

struct Sqlite(rusqlite::Connection);

impl Raw for Sqlite {
    fn batch(&mut self, sql: &str) {
        self.0.execute_batch(sql).expect("sqlite batch");
    }
    fn count(&mut self, sql: &str) -> i64 {
        self.0.query_row(sql, [], |r| r.get(0)).expect(sql)
    }
}

struct Postgres(postgres::Client);

impl Raw for Postgres {
    fn batch(&mut self, sql: &str) {
        self.0.batch_execute(sql).expect("postgres batch");
    }
    fn count(&mut self, sql: &str) -> i64 {
        self.0.query_one(sql, &[]).expect(sql).get(0)
    }
}

fn counts(raw: &mut dyn Raw) -> Vec<i64> {
    TABLES
        .iter()
        .map(|t| raw.count(&format!("SELECT COUNT(*) FROM {t}")))
        .collect()
}

/// One database loaded from a fixture, with a raw connection to it.
struct Case {
    url: String,
    raw: Box<dyn Raw>,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<TempPostgres>,
}

/// A database loaded from `fixture` (empty: a fresh one).
fn sqlite_case(fixture: &str) -> Case {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("moat.db");
    let mut raw = Sqlite(rusqlite::Connection::open(&path).expect("sqlite"));
    raw.batch(fixture);
    Case {
        url: format!("sqlite:{}", path.display()),
        raw: Box::new(raw),
        _dir: Some(dir),
        _pg: None,
    }
}

fn postgres_case(fixture: &str) -> Case {
    let pg = TempPostgres::create().expect(
        "PostgreSQL is needed for the upgrade tests: bash tests/suite.sh starts a throwaway one \
         (set MOAT_TEST_POSTGRES to a libpq key=value string to use another server)",
    );
    let mut raw = Postgres(
        pg.url
            .parse::<postgres::Config>()
            .expect("url")
            .connect(postgres::NoTls)
            .expect("connect"),
    );
    raw.batch(fixture);
    Case {
        url: pg.url.clone(),
        raw: Box::new(raw),
        _dir: None,
        _pg: Some(pg),
    }
}

fn cases() -> Vec<(&'static str, Case)> {
    vec![
        ("sqlite", sqlite_case(SQLITE_FIXTURE)),
        ("postgres", postgres_case(POSTGRES_FIXTURE)),
    ]
}

/// The migrations in `migrations/<backend>/`: V1, then V2 (runner
/// enrolments), V3 (runs' manifest pin), V4 (usage by day), V5 (the export
/// boundary's quarantine and held exports), V6 (the output store), V7
/// (workload classes), V8 (runners' hosts and labels), V9 (placement and
/// quotas), V10 (volumes), V11 (worker queues), V12 (ops by number), V13
/// (plans without statistics: a run's op counter).
const MIGRATIONS: i64 = 13;

fn history(raw: &mut dyn Raw) -> i64 {
    raw.count("SELECT COUNT(*) FROM moat_schema_history")
}

/// What the fixture holds, read back through the store.
fn assert_fixture_readable(store: &Store, backend: &str) {
    let verified = store
        .verify_ledger()
        .expect("verify")
        .unwrap_or_else(|e| panic!("{backend}: chain broken after the upgrade: {e}"));
    assert_eq!(verified.events, 38, "{backend}");

    let hello = store.run(ORG, "hello-fixture").unwrap().expect("run");
    assert_eq!(hello.state, RunState::Succeeded, "{backend}");
    assert_eq!(hello.inputs[0]["path"], "input/a.txt", "{backend}");
    let ops = store.ops(ORG, "hello-fixture").unwrap();
    assert_eq!(ops.len(), 1, "{backend}");
    assert_eq!(ops[0].state, OpState::Succeeded, "{backend}");

    let demo = store.ops(ORG, "demo-6a2682c2").unwrap();
    assert_eq!(demo.len(), 4, "{backend}");
    assert_eq!(demo[3].state, OpState::PendingApproval, "{backend}");
    let pending = store
        .approvals(ORG, Some(ApprovalState::Pending), 10)
        .unwrap();
    assert_eq!(pending.len(), 1, "{backend}: the pending approval survives");
    assert_eq!(pending[0].op_id, "export", "{backend}");

    let artifacts = store.artifacts(ORG, "demo-6a2682c2").unwrap();
    assert!(!artifacts.is_empty(), "{backend}");
    let bytes = store
        .artifact_bytes(ORG, &artifacts[0].sha256)
        .unwrap()
        .expect("artifact bytes");
    assert_eq!(
        moat_core::hash::sha256_hex(&bytes),
        artifacts[0].sha256,
        "{backend}"
    );
    assert!(store.runner(RUNNER).unwrap().is_some(), "{backend}");
}

#[test]
fn a_database_from_before_versioning_upgrades_in_place() {
    for (backend, mut case) in cases() {
        let before = counts(case.raw.as_mut());
        let store = Store::open(&case.url).expect("open upgrades");
        assert_eq!(
            counts(case.raw.as_mut()),
            before,
            "{backend}: rows changed by the upgrade"
        );
        assert_eq!(
            history(case.raw.as_mut()),
            MIGRATIONS,
            "{backend}: V1 and every later migration recorded"
        );
        assert_eq!(
            store.runner(RUNNER).unwrap().expect("runner").slots,
            4,
            "{backend}: the runner keeps its slots"
        );
        assert_fixture_readable(&store, backend);

        // The chain goes on from the old head, and still verifies.
        store
            .create_run(
                &NewRun {
                    org: ORG,
                    id: "after-upgrade",
                    environment: "local",
                    inputs: &[],
                    blobs: &[],
                    manifest_hash: None,
                    max_attempts: 1,
                    needs_classes: &[],
                    volumes: &[],
                },
                2_000,
            )
            .expect("a new run after the upgrade");
        let verified = store.verify_ledger().unwrap().expect("chain");
        assert!(verified.events > 38, "{backend}: {}", verified.events);

        // An old run's next op is numbered after the ops it had (the run's
        // counter starts from them), and a new run's first op is 1.
        let queue = |run: &str, id: &str| {
            let op = store
                .insert_op(
                    &NewOp {
                        org: ORG,
                        run,
                        id,
                        op: "artifact_read",
                        state: OpState::Queued,
                        envelope: &serde_json::json!({}),
                        decision: &serde_json::json!({}),
                        result: None,
                        events: &[],
                        approval: None,
                    },
                    2_001,
                )
                .unwrap_or_else(|e| panic!("{backend}: queue {id} on {run}: {e}"))
                .unwrap_or_else(|| panic!("{backend}: {run} refused an op"));
            op.n
        };
        let last = store
            .ops(ORG, "demo-6a2682c2")
            .unwrap()
            .last()
            .expect("old ops")
            .n;
        assert_eq!(
            queue("demo-6a2682c2", "after-upgrade"),
            last + 1,
            "{backend}"
        );
        if backend == "postgres" {
            // A replica of the old build, still running in a rolling
            // upgrade, numbers its op from MAX(n); the next op of the new
            // build is numbered after it. (SQLite has one server.)
            case.raw.batch(
                "INSERT INTO ops (run_id, id, org_id, n, op, state, envelope, decision, result,
                                  created_ms, updated_ms)
                 SELECT 'demo-6a2682c2', 'from-an-old-replica', org_id, MAX(n) + 1,
                        'artifact_read', 'queued', '{}', '{}', NULL, 2002, 2002
                 FROM ops WHERE run_id = 'demo-6a2682c2' GROUP BY org_id",
            );
            assert_eq!(queue("demo-6a2682c2", "after-the-old-one"), last + 3);
        }
        assert_eq!(queue("after-upgrade", "first"), 1, "{backend}");
        assert_eq!(queue("after-upgrade", "second"), 2, "{backend}");
        drop(store);

        // Opening again applies nothing and loses nothing.
        let after = counts(case.raw.as_mut());
        let store = Store::open(&case.url).expect("reopen");
        assert_eq!(counts(case.raw.as_mut()), after, "{backend}");
        assert_eq!(history(case.raw.as_mut()), MIGRATIONS, "{backend}");
        assert!(store.verify_ledger().unwrap().is_ok(), "{backend}");
    }
}

#[test]
fn a_database_from_before_runner_slots_gets_the_column() {
    for (backend, mut case) in cases() {
        // The first release had no `runners.slots`.
        case.raw.batch("ALTER TABLE runners DROP COLUMN slots");
        let store = Store::open(&case.url).expect("open upgrades");
        assert_eq!(
            store.runner(RUNNER).unwrap().expect("runner").slots,
            1,
            "{backend}: the column's default"
        );
        assert_fixture_readable(&store, backend);
    }
}

#[test]
fn a_database_newer_than_this_build_is_refused() {
    for (backend, mut case) in cases() {
        drop(Store::open(&case.url).expect("upgrade"));
        case.raw.batch(
            "INSERT INTO moat_schema_history (version, name, applied_on, checksum)
             VALUES (999, 'from_the_future', '2030-01-01T00:00:00Z', '0')",
        );
        let before = counts(case.raw.as_mut());
        let err = Store::open(&case.url)
            .err()
            .unwrap_or_else(|| panic!("{backend}: a newer schema was opened"));
        let message = err.to_string();
        assert!(
            message.contains("version 999") && message.contains("newer"),
            "{backend}: {message}"
        );
        assert_eq!(counts(case.raw.as_mut()), before, "{backend}");
    }
}

#[test]
fn a_fresh_database_starts_at_the_newest_version() {
    for (backend, mut case) in [("sqlite", sqlite_case("")), ("postgres", postgres_case(""))] {
        let store = Store::open(&case.url).expect("open");
        assert_eq!(history(case.raw.as_mut()), MIGRATIONS, "{backend}");
        assert_eq!(
            case.raw.count("SELECT seq FROM ledger_head WHERE id = 1"),
            0,
            "{backend}: genesis head"
        );
        assert!(store.verify_ledger().unwrap().is_ok(), "{backend}");
    }
}
