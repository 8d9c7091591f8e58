//! Epoch ordering under concurrent writers: a reader that only ever asks
//! for "epoch greater than the last one I saw" must miss nothing, on both
//! backends, straight against the store and through two roots sharing one
//! database. And a bulk apply is one transaction: all of it or none.

#[macro_use]
mod root_support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use sluice::core::spec::QuotaSpec;
use sluice::root::store::{ApplyOptions, DbState, PutOutcome, Store, StoreError};
use sluice::wire::QuotaCursor;
use sqlx::{Connection, Executor};

use root_support::{config, Db, Limiter, TestRoot};

on_both_backends!(
    concurrent_writers_then_an_incremental_reader_miss_nothing,
    pages_split_one_epoch_and_continue_into_the_next,
    a_bulk_apply_that_fails_midway_leaves_nothing_behind,
    a_look_while_writes_commit_never_finds_the_epoch_went_back,
);

const WRITERS: usize = 8;
const WRITES_EACH: usize = 25;

/// `(epoch, limit)` per quota id.
type Seen = BTreeMap<u64, (u64, f64)>;

async fn read_after(store: &Store, cursor: &mut QuotaCursor, seen: &mut Seen) {
    let rows = store.load_after(*cursor, 1000).await.expect("read");
    for row in rows {
        let quota = row.expect("valid row");
        assert!(
            (quota.epoch, quota.id) > (cursor.epoch, cursor.id),
            "rows out of order"
        );
        *cursor = QuotaCursor {
            epoch: quota.epoch,
            id: quota.id,
        };
        seen.insert(quota.id, (quota.epoch, quota.limit));
    }
}

/// Puts, retrying while the database is busy (SQLite has one writer; a
/// client would retry the same way).
async fn put_retrying(store: &Store, spec: &QuotaSpec) -> u64 {
    loop {
        match store.put(spec).await {
            Ok(PutOutcome::Created(w) | PutOutcome::Updated(w)) => return w.epoch,
            Ok(PutOutcome::Unchanged { .. }) => panic!("every write changes the limit"),
            Err(StoreError::Unavailable(_)) => tokio::task::yield_now().await,
            Err(e) => panic!("put: {e}"),
        }
    }
}

/// [`WRITERS`] tasks, each putting `writes` times over its own four
/// quotas (`{prefix}{writer}_{0..4}`), every write a new limit; each
/// returns the epochs its writes got.
fn spawn_writers(
    store: &Store,
    prefix: &'static str,
    writes: usize,
) -> Vec<tokio::task::JoinHandle<Vec<u64>>> {
    (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut epochs = Vec::new();
                for i in 0..writes {
                    let spec = QuotaSpec::new(format!("{prefix}{w}_{}", i % 4), (i + 1) as f64);
                    epochs.push(put_retrying(&store, &spec).await);
                }
                epochs
            })
        })
        .collect()
}

async fn concurrent_writers_then_an_incremental_reader_miss_nothing(db: Db) {
    let store = Store::open(&db.url, Duration::from_secs(10), 16).unwrap();
    store.migrate().await.unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn({
        let (store, done) = (store.clone(), Arc::clone(&done));
        async move {
            let (mut cursor, mut seen) = (QuotaCursor::default(), Seen::new());
            while !done.load(Ordering::Acquire) {
                read_after(&store, &mut cursor, &mut seen).await;
            }
            // One last read after every writer has committed.
            read_after(&store, &mut cursor, &mut seen).await;
            seen
        }
    });
    let writers = spawn_writers(&store, "w", WRITES_EACH);
    let mut epochs = HashSet::new();
    for writer in writers {
        for epoch in writer.await.unwrap() {
            assert!(epochs.insert(epoch), "epoch {epoch} given twice");
        }
    }
    done.store(true, Ordering::Release);
    let seen = reader.await.unwrap();

    // Every write got its own epoch, 1..=N without gaps.
    assert_eq!(epochs.len(), WRITERS * WRITES_EACH);
    assert_eq!(
        epochs.iter().max().copied(),
        Some((WRITERS * WRITES_EACH) as u64)
    );
    // The incremental reader ends with exactly the database's state.
    let (mut cursor, mut truth) = (QuotaCursor::default(), Seen::new());
    read_after(&store, &mut cursor, &mut truth).await;
    assert_eq!(truth.len(), WRITERS * 4);
    assert_eq!(seen, truth);
    store.close().await;
}

/// The database watcher's look (`inspect`) races the writers' commits:
/// a look whose read began before a commit must not compare its older
/// epoch with the newer one that commit made the root see meanwhile, or
/// a healthy database is taken for one restored from an older copy (and
/// the root refuses writes until restarted).
async fn a_look_while_writes_commit_never_finds_the_epoch_went_back(db: Db) {
    let store = Store::open(&db.url, Duration::from_secs(10), 16).unwrap();
    store.migrate().await.unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let looker = tokio::spawn({
        let (store, done) = (store.clone(), Arc::clone(&done));
        async move {
            let mut looks = 0u32;
            while !done.load(Ordering::Acquire) {
                let state = store.inspect().await.expect("look");
                assert!(
                    !matches!(state, DbState::Lost(_)),
                    "look {looks} while writes commit: {state:?}"
                );
                looks += 1;
            }
            looks
        }
    });
    let writers = spawn_writers(&store, "l", WRITES_EACH * 2);
    for writer in writers {
        writer.await.unwrap();
    }
    done.store(true, Ordering::Release);
    let looks = looker.await.unwrap();
    assert!(looks > 0, "the looker never looked");
    store.close().await;
}

/// Two roots on one PostgreSQL database take writes at the same time; a
/// limiter syncing with one of them ends up with every quota as the
/// database holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_roots_on_one_postgres_database_lose_no_write() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    let (one, two) = (
        TestRoot::start(config(&db)).await,
        TestRoot::start(config(&db)).await,
    );
    let done = Arc::new(AtomicBool::new(false));
    let syncing = tokio::spawn({
        let (url, done) = (one.url.clone(), Arc::clone(&done));
        async move {
            let root = TestRoot::attach(&url);
            let mut limiter = Limiter::new("watcher");
            while !done.load(Ordering::Acquire) {
                limiter.sync(&root, &[]).await;
            }
            limiter
        }
    });
    let writes: Vec<_> = (0..60)
        .map(|i| {
            let root = TestRoot::attach(if i % 2 == 0 { &one.url } else { &two.url });
            let body = json!({"limit": i, "parent": null});
            tokio::spawn(async move { root.put(&format!("q{}", i % 10), body).await })
        })
        .collect();
    let mut replies: Vec<Value> = Vec::new();
    for write in writes {
        replies.push(write.await.unwrap());
    }
    let last_epoch = replies
        .iter()
        .filter_map(|r| r["epoch"].as_u64())
        .max()
        .unwrap();
    // Wait until root one has reloaded everything, then a final sync.
    root_support::eventually("root one reloaded the last write", || async {
        let (_, health) = one.request(Method::GET, "/healthz", None, None).await;
        health["epoch"].as_u64() >= Some(last_epoch)
    })
    .await;
    done.store(true, Ordering::Release);
    let mut limiter = syncing.await.unwrap();
    limiter.catch_up(&one).await;

    let (_, list) = two.admin(Method::GET, "/v1/quotas", None).await;
    for quota in list["quotas"].as_array().unwrap() {
        let id = quota["id"].as_u64().unwrap();
        let held = &limiter.quotas[&id];
        assert_eq!(
            (&held["epoch"], &held["limit"]),
            (&quota["epoch"], &quota["limit"]),
            "{quota}"
        );
    }
    assert_eq!(list["quotas"].as_array().unwrap().len(), 10);
    one.stop().await;
    two.stop().await;
}

async fn pages_split_one_epoch_and_continue_into_the_next(db: Db) {
    let store = Store::open(&db.url, Duration::from_secs(10), 4).unwrap();
    store.migrate().await.unwrap();
    let spec = |name: String| QuotaSpec::new(name, 1.0);
    let set: Vec<QuotaSpec> = (0..25).map(|i| spec(format!("bulk{i}"))).collect();
    store.apply(set, ApplyOptions::default()).await.unwrap();
    put_retrying(&store, &spec("later".into())).await;

    let (mut cursor, mut order) = (QuotaCursor::default(), Vec::new());
    loop {
        let page = store.load_after(cursor, 10).await.unwrap();
        let full = page.len() == 10;
        for row in page {
            let quota = row.unwrap();
            cursor = QuotaCursor {
                epoch: quota.epoch,
                id: quota.id,
            };
            order.push((quota.epoch, quota.id));
        }
        if !full {
            break;
        }
    }
    assert_eq!(order.len(), 26);
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    assert_eq!(
        order[..25]
            .iter()
            .map(|o| o.0)
            .collect::<HashSet<_>>()
            .len(),
        1
    );
    assert!(order[25].0 > order[0].0);
    store.close().await;
}

/// Makes the database itself refuse to insert a quota named `poison`, the
/// way a constraint or a lost connection can fail a statement in the
/// middle of a transaction.
async fn poison_inserts(db: &Db) {
    let mut conn = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    let statements: &[&str] = if db.url.starts_with("sqlite:") {
        &[
            "CREATE TRIGGER poison BEFORE INSERT ON quotas WHEN NEW.name = 'poison' \
           BEGIN SELECT RAISE(ABORT, 'poisoned row'); END",
        ]
    } else {
        &[
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'poisoned row'; END $$",
            "CREATE TRIGGER poison BEFORE INSERT ON quotas FOR EACH ROW \
             WHEN (NEW.name = 'poison') EXECUTE FUNCTION poison()",
        ]
    };
    for statement in statements {
        conn.execute(*statement).await.unwrap();
    }
    conn.close().await.unwrap();
}

async fn a_bulk_apply_that_fails_midway_leaves_nothing_behind(db: Db) {
    let store = Store::open(&db.url, Duration::from_secs(10), 4).unwrap();
    store.migrate().await.unwrap();
    let spec = |name: &str, parent: Option<&str>| QuotaSpec {
        parent: parent.map(str::to_string),
        ..QuotaSpec::new(name, 1.0)
    };
    put_retrying(&store, &spec("kept", None)).await;
    let epoch_before = store.epoch().await.unwrap();
    poison_inserts(&db).await;

    // Valid as a set, so every check passes; the 120 top-level quotas are
    // inserted (three statements) before the poisoned child fails.
    let mut set: Vec<QuotaSpec> = (0..120).map(|i| spec(&format!("bulk{i}"), None)).collect();
    set.push(spec("poison", Some("bulk0")));
    set.push(spec("kept", Some("bulk0")));
    let error = store.apply(set, ApplyOptions::default()).await.unwrap_err();
    assert!(error.to_string().contains("poisoned row"), "{error}");

    assert_eq!(store.epoch().await.unwrap(), epoch_before);
    let rows = store
        .load_after(QuotaCursor::default(), 1000)
        .await
        .unwrap();
    let quotas: Vec<_> = rows.into_iter().map(Result::unwrap).collect();
    assert_eq!(quotas.len(), 1, "{quotas:?}");
    assert_eq!((quotas[0].name.as_str(), quotas[0].parent), ("kept", None));
    store.close().await;
}
