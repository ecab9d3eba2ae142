//! Prepared statements planned again once a table has grown.
//!
//! A pooled connection plans a prepared statement generically at its
//! first use (`plan_cache_mode`, see `db::GENERIC_PLANS`; PostgreSQL's
//! default plans it five times for its parameters first) and keeps that
//! plan until the statistics of a table the statement reads change, which
//! is autovacuum's next ANALYZE, up to a minute away. A plan settled on while a table was one page long
//! reads that table from end to end, which is rightly cheapest for one page:
//! measured on the control plane's benchmark, the lookup of a run by its
//! primary key kept a sequential scan while `runs` grew from one row to
//! 5,000 in 25 seconds, and the claims and finishes that read it that way
//! (under the claim's turn, which the other claims wait for) took the runs
//! per second from about 190 to 120.
//!
//! So at most once a second the pool looks at the size in pages of each
//! table of its schema (one read of the catalogue), and when one has at
//! least doubled since its size last started an epoch (or since the pool
//! first saw it), it starts a new epoch: a connection taken from the pool
//! prepares its statements anew if it prepared them in an earlier epoch,
//! and the planner, which scales what the statistics say by a table's
//! current pages, plans them for the tables as they are. A table that
//! grows from nothing to N pages starts about log2(N) epochs; a table that
//! keeps its size, none.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the tables' sizes are looked at, at most.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The sizes in pages of the tables of the connection's schema.
const SIZES: &str = "SELECT c.relname::text AS name,
        pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r' AND n.nspname = current_schema()";

/// The pool's plan epoch and what it was last decided on.
#[derive(Default)]
pub(crate) struct Replan {
    epoch: AtomicU64,
    looked: Mutex<Looked>,
}

#[derive(Default)]
struct Looked {
    at: Option<Instant>,
    /// Each table's pages when its size last started an epoch (or was
    /// first seen).
    pages: HashMap<String, i64>,
}

impl Replan {
    /// The current epoch, after a look at the tables through `client` if
    /// the last one is a second old (one caller looks; the others go on
    /// with the epoch as it is).
    pub fn epoch(&self, client: &mut postgres::Client) -> u64 {
        if let Ok(mut looked) = self.looked.try_lock()
            && looked.at.is_none_or(|at| at.elapsed() >= LOOK_EVERY)
        {
            looked.at = Some(Instant::now());
            // A look that fails changes nothing: the plans stay as they
            // are, and the statement that follows meets the same fault.
            if let Ok(rows) = client.query(SIZES, &[]) {
                let sizes = rows
                    .iter()
                    .filter_map(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)));
                if looked.update(sizes) {
                    self.epoch.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.epoch.load(Ordering::Relaxed)
    }
}

impl Looked {
    /// Records `sizes`; true if a table has at least doubled (from one
    /// page to two at the least; a table not seen before, from none) since
    /// it was last recorded.
    fn update(&mut self, sizes: impl Iterator<Item = (String, i64)>) -> bool {
        let mut grown = false;
        for (name, pages) in sizes {
            let before = self.pages.entry(name).or_insert(0);
            if pages >= 2 * (*before).max(1) {
                *before = pages;
                grown = true;
            } else if *before == 0 {
                *before = pages;
            }
        }
        grown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(list: &[(&str, i64)]) -> impl Iterator<Item = (String, i64)> {
        list.iter()
            .map(|(n, p)| ((*n).to_owned(), *p))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn an_epoch_starts_when_a_table_has_doubled() {
        let mut looked = Looked::default();
        assert!(
            looked.update(sizes(&[("runs", 0), ("ops", 3)])),
            "ops seen at 3"
        );
        assert!(!looked.update(sizes(&[("runs", 1), ("ops", 5)])));
        assert!(
            looked.update(sizes(&[("runs", 2), ("ops", 5)])),
            "1 to 2 pages"
        );
        assert!(!looked.update(sizes(&[("runs", 3), ("ops", 5)])));
        assert!(looked.update(sizes(&[("runs", 3), ("ops", 6)])), "3 to 6");
        assert!(!looked.update(sizes(&[("runs", 3), ("ops", 11)])));
        assert!(looked.update(sizes(&[("runs", 4), ("ops", 12)])), "6 to 12");
        assert!(!looked.update(sizes(&[("runs", 1), ("ops", 12)])), "shrunk");
        assert!(looked.update(sizes(&[("new", 40)])), "a new table, grown");
        assert!(!looked.update(sizes(&[("newer", 1)])), "a new table, small");
    }
}
