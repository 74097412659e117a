//! The object stores' tests, against the in-memory store: puts, held and streamed shards, the lock.

use super::*;
use crate::record::storelock::Access;

#[test]
fn keys_are_paths_below_the_bucket() {
    let o = Objects::in_memory("memory:///runs/run1.zarr").unwrap();
    let k = o.key(&o.root().join("layer1/h/zarr.json")).unwrap();
    assert_eq!(k.as_ref(), "runs/run1.zarr/layer1/h/zarr.json");
    assert_eq!(o.path_of(&k), o.root().join("layer1/h/zarr.json"));
}

#[test]
fn put_get_list_remove() {
    let o = Objects::in_memory("memory:///r.zarr").unwrap();
    let root = o.root().to_path_buf();
    o.put(&root.join("a/zarr.json"), b"{}", Put::Document).unwrap();
    o.put(&root.join("a/c/0"), b"xy", Put::Fresh).unwrap();
    assert!(o.exists(&root.join("a")) && o.exists(&root.join("a/c/0")) && !o.exists(&root.join("b")));
    assert_eq!(o.get(&root.join("a/c/0")).unwrap(), b"xy");
    let mut listed = o.list(&root.join("a")).unwrap();
    listed.sort();
    assert_eq!(listed, vec![root.join("a/c"), root.join("a/zarr.json")]);
    o.remove(&root.join("a")).unwrap();
    assert!(!o.exists(&root.join("a")));
    assert_eq!(o.get(&root.join("a/c/0")).unwrap_err().kind(), io::ErrorKind::NotFound);
}

#[test]
fn a_large_object_goes_up_in_parts_and_reads_back_whole() {
    let o = Objects::in_memory("memory:///r.zarr").unwrap();
    let path = o.root().join("g/x/c/0/0");
    let bytes: Vec<u8> = (0..MULTIPART_ABOVE + PART + 12_345).map(|i| u8::try_from(i % 251).unwrap()).collect();
    o.put(&path, &bytes, Put::Fresh).unwrap();
    assert!(o.get(&path).unwrap() == bytes);
}

/// Streams `pieces` to a new object of `o` and finishes it.
fn streamed(o: &Arc<Objects>, name: &str, pieces: &[Vec<u8>]) -> (PathBuf, Vec<u8>) {
    let path = o.root().join(name);
    let mut up = o.stream(&path).unwrap().unwrap();
    for p in pieces {
        up.push(p.clone()).unwrap();
    }
    up.finish().unwrap();
    (path, pieces.concat())
}

fn piece(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| u8::try_from((i * 7 + seed) % 251).unwrap()).collect()
}

#[test]
fn a_shard_held_whole_goes_up_in_one_request() {
    let o = Objects::in_memory("memory:///r.zarr").unwrap();
    let pieces = [piece(1 << 20, 1), piece(1 << 20, 2), piece(100, 3)];
    let (path, whole) = streamed(&o, "x/c/0", &pieces);
    assert!(o.get(&path).unwrap() == whole);
    assert_eq!(o.single_puts.load(Ordering::Relaxed), 1);
    assert_eq!(o.multipart_puts.load(Ordering::Relaxed), 0);
    assert_eq!(o.held.load(Ordering::Relaxed), 0, "the reservation ends with the put");
}

#[test]
fn a_shard_past_the_hold_limit_becomes_a_multipart_upload() {
    // One shard larger than the limit: its held pieces become the first part.
    let o = Objects::in_memory_holding("memory:///r.zarr", (5 << 20) / 2).unwrap();
    let pieces: Vec<Vec<u8>> = (0..20).map(|k| piece(1 << 20, k)).collect();
    let (path, whole) = streamed(&o, "x/c/0", &pieces);
    assert!(o.get(&path).unwrap() == whole);
    assert_eq!((o.single_puts.load(Ordering::Relaxed), o.multipart_puts.load(Ordering::Relaxed)), (0, 1));
    assert_eq!(o.held.load(Ordering::Relaxed), 0);
    // Limit 0: every shard is streamed.
    let o = Objects::in_memory_holding("memory:///r.zarr", 0).unwrap();
    streamed(&o, "x/c/0", &[piece(10, 1)]);
    assert_eq!((o.single_puts.load(Ordering::Relaxed), o.multipart_puts.load(Ordering::Relaxed)), (0, 1));
    assert_eq!(o.multipart_aborts.load(Ordering::Relaxed), 0, "a finished upload is not aborted");
    // A multipart upload dropped unfinished (its writer failed) is aborted: no object, no
    // parts left on the server.
    let gone = o.root().join("y/c/0");
    let mut up = o.stream(&gone).unwrap().unwrap();
    up.push(piece(PART + 10, 2)).unwrap(); // a part sent
    drop(up);
    assert_eq!(o.multipart_aborts.load(Ordering::Relaxed), 1);
    assert!(!o.exists(&gone));
}

#[test]
fn shards_held_together_stay_within_the_limit() {
    let o = Objects::in_memory_holding("memory:///r.zarr", 3 << 20).unwrap();
    let a_path = o.root().join("a/c/0");
    let mut a = o.stream(&a_path).unwrap().unwrap();
    a.push(piece(2 << 20, 1)).unwrap();
    assert_eq!(o.held.load(Ordering::Relaxed), 2 << 20);
    // A second shard finds 1 MiB left: it is held up to that, then streamed.
    let (b_path, b_whole) = streamed(&o, "b/c/0", &[piece(1 << 20, 2), piece(1 << 20, 3)]);
    assert_eq!(o.multipart_puts.load(Ordering::Relaxed), 1);
    assert_eq!(o.held.load(Ordering::Relaxed), 2 << 20, "b's held piece was released");
    a.push(piece(1 << 20, 4)).unwrap();
    a.finish().unwrap();
    assert_eq!(o.single_puts.load(Ordering::Relaxed), 1);
    assert!(o.get(&b_path).unwrap() == b_whole);
    assert!(o.get(&a_path).unwrap() == [piece(2 << 20, 1), piece(1 << 20, 4)].concat());
    // An upload dropped unfinished (a failed write) frees what it held; no object.
    let gone = o.root().join("c/c/0");
    let mut c = o.stream(&gone).unwrap().unwrap();
    c.push(piece(1 << 20, 5)).unwrap();
    drop(c);
    assert_eq!(o.held.load(Ordering::Relaxed), 0);
    assert!(!o.exists(&gone));
}

#[test]
fn a_document_is_replaced_only_from_the_version_this_process_wrote() {
    let o = Objects::in_memory("memory:///r.zarr").unwrap();
    let doc = o.root().join("zarr.json");
    o.put(&doc, b"1", Put::Document).unwrap();
    o.put(&doc, b"2", Put::Document).unwrap();
    // Another writer replaces it behind our back: our next replacement fails.
    let key = o.key(&doc).unwrap();
    o.put_mode(&key, b"theirs", PutMode::Overwrite).unwrap();
    let e = o.put(&doc, b"3", Put::Document).unwrap_err();
    assert!(e.to_string().contains("another writer changed it"), "{e}");
    assert_eq!(o.get(&doc).unwrap(), b"theirs");
}

#[test]
fn the_lock_refuses_a_second_holder_until_its_lease_ends() {
    let o = Objects::in_memory("memory:///r.zarr").unwrap();
    let root = o.root().to_path_buf();
    let first = ObjectLock::acquire(&o, &root, Duration::from_secs(60), &Access::Exclusive).unwrap();
    let e = ObjectLock::acquire(&o, &root, Duration::from_secs(60), &Access::Exclusive).unwrap_err();
    assert!(matches!(e, RecordError::Io { errno: Some(libc::EBUSY), .. }), "{e}");
    assert!(e.to_string().contains(&format!("process {} on host", std::process::id())), "{e}");
    assert!(ObjectLock::check_free(&o, &root).is_err());
    drop(first);
    ObjectLock::check_free(&o, &root).unwrap();
    // A holder that never renews (a crashed process): once its lease ends, the store
    // is taken over, and the old holder's renewal reports the loss.
    let crashed = ObjectLock::acquire(&o, &root, Duration::from_millis(30), &Access::Exclusive).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let next = ObjectLock::acquire(&o, &root, Duration::from_secs(60), &Access::Exclusive).unwrap();
    let lost = crashed.renew_if_due().unwrap_err();
    assert!(lost.to_string().contains("took the store over"), "{lost}");
    drop(crashed); // must not delete the new holder's lock
    assert!(ObjectLock::check_free(&o, &root).is_err());
    drop(next);
}

#[test]
fn secrets_never_appear_in_messages() {
    let o = Objects::open(
        "s3://bucket/run.zarr",
        &[
            ("aws_secret_access_key".into(), "SUPERSECRETVALUE".into()),
            ("aws_access_key_id".into(), "AKIDPUBLIC".into()),
            ("aws_endpoint".into(), "http://127.0.0.1:9".into()),
            ("aws_allow_http".into(), "true".into()),
            ("aws_region".into(), "us-east-1".into()),
            (MAX_RETRIES.into(), "0".into()),
        ],
    )
    .unwrap();
    assert!(!format!("{o:?}").contains("SUPERSECRETVALUE"));
    assert_eq!(o.redact("x SUPERSECRETVALUE y".into()), "x *** y");
    let e = o.check_reachable().unwrap_err();
    assert!(!e.to_string().contains("SUPERSECRETVALUE"), "{e}");
    assert!(e.to_string().contains("s3://bucket/run.zarr"), "{e}");
}

#[test]
fn provider_errors_are_shortened_to_their_code_and_message() {
    let raw = "list failed: 404 Not Found: <?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code>\
               <Message>The specified bucket does not exist</Message><RequestId>x</RequestId></Error>";
    assert_eq!(tidy(raw), "list failed: 404 Not Found: NoSuchBucket: The specified bucket does not exist");
    assert_eq!(tidy("plain"), "plain");
}

#[test]
fn unknown_options_and_schemes_are_refused() {
    let e = Objects::open("s3://b/r.zarr", &[("aws_bogus".into(), "1".into())]).unwrap_err();
    assert!(e.to_string().contains("unknown storage option \"aws_bogus\""), "{e}");
    let e = Objects::open("s3://b/r.zarr", &[(RETRY_TIMEOUT.into(), "soon".into())]).unwrap_err();
    assert!(e.to_string().contains("number of seconds"), "{e}");
    let e = Objects::open("s3://b/r.zarr", &[(SINGLE_PUT_BYTES.into(), "1GB".into())]).unwrap_err();
    assert!(e.to_string().contains("whole number of bytes"), "{e}");
}
