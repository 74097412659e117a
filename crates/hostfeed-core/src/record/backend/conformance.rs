//! The store conformance suite: what every storage back-end must do for the recorder, one
//! generic suite that each back-end's own tests run (as zarrs' `store_test.rs` is for its
//! stores): [`run`], over a function that opens the back-end at a root. A new back-end is
//! its file and a test there that calls [`run`].
//!
//! Each check takes a fresh root of its own: whole-object puts (fresh, replacing, a
//! metadata document) read back with nothing else left beside them, writes into part of an
//! object where the store has them, objects streamed piece by piece where it has those,
//! `exists` and `create_dir`, listing the names directly below a key, byte-range reads,
//! removing an object and everything below a key (twice: the second time is no error), the
//! store's lock (exclusive and shared, seen by a second opener), and `prepare` (a root made
//! ready for each mode under the lock).
//!
//! [`S3sFs`] starts an S3 server (s3s-fs, an independent implementation in Rust, serving a
//! temporary folder) for the object store's run: its binary is `$S3S_FS` or on `PATH`
//! (`cargo install s3s-fs --version 0.14.1 --features binary`); without one that run says
//! it was skipped, and fails where `HOSTFEED_REQUIRE_S3S=1` (CI).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::api::{Backend, Held};
use super::root::{is_recording, root_attributes};
use crate::error::RecordError;
use crate::record::common::Mode;
use crate::record::store::{create_parent, Put, Store};
use crate::record::storelock::Access;

/// What a back-end's store offers beyond what every store does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offers {
    /// Writes into part of an object ([`Store::in_place`]).
    pub(crate) in_place: bool,
    /// Objects streamed piece by piece ([`Store::stream`]).
    pub(crate) streams: bool,
}

/// Opens the back-end at the root named `name` (a fresh name for each check; the same name
/// twice: a second opener of the same store).
pub(crate) type Opener<'a> = &'a dyn Fn(&str) -> Box<dyn Backend>;

/// One check of the suite.
type Check = fn(Opener<'_>, Offers);

/// Runs every check over the back-end that `open` opens, whose store offers `offers`.
pub(crate) fn run(open: Opener<'_>, offers: Offers) {
    let checks: [(&str, Check); 11] = [
        ("fresh-puts", fresh_puts),
        ("replacing-puts", replacing_puts),
        ("documents", documents),
        ("in-place", in_place),
        ("streams", streams),
        ("exists", exists_and_create_dir),
        ("listing", listing),
        ("ranges", ranges),
        ("removing", removing_twice),
        ("lock", lock),
        ("prepare", prepare),
    ];
    for (name, check) in checks {
        let started = Instant::now();
        check(&|root| open(&format!("{name}-{root}")), offers);
        eprintln!("store conformance: {name} passed in {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
    }
}

/// The store of the back-end at `name`, its root, and the path of `key` below it.
fn store_at(open: Opener<'_>, name: &str) -> (Box<dyn Backend>, Box<dyn Store>, PathBuf) {
    let backend = open(name);
    let store = backend.store(false);
    let root = backend.root().to_path_buf();
    (backend, store, root)
}

fn put(store: &dyn Store, path: &Path, bytes: &[u8], how: Put) {
    create_parent(store, path).unwrap();
    store.put(path, bytes, how).unwrap_or_else(|e| panic!("put {}: {e}", path.display()));
}

/// The names directly below `dir`, sorted; none where nothing is stored.
fn names(store: &dyn Store, dir: &Path) -> Vec<String> {
    let listed = match store.list(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        other => other.unwrap_or_else(|e| panic!("list {}: {e}", dir.display())),
    };
    for p in &listed {
        assert_eq!(p.parent(), Some(dir), "{} is listed below {}", p.display(), dir.display());
    }
    let mut names: Vec<String> = listed.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

fn bytes(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| u8::try_from((i * 7 + seed) % 251).unwrap()).collect()
}

/// A fresh object (a chunk past the announced rows) is put, read back, put again shorter;
/// nothing else appears beside it.
fn fresh_puts(open: Opener<'_>, _: Offers) {
    let (_b, store, root) = store_at(open, "a");
    let chunk = root.join("g/x/c/0");
    put(&*store, &chunk, &bytes(300, 1), Put::Fresh);
    assert_eq!(store.get(&chunk).unwrap(), bytes(300, 1));
    put(&*store, &chunk, b"short", Put::Fresh);
    assert_eq!(store.get(&chunk).unwrap(), b"short", "a shorter fresh put replaces the whole object");
    put(&*store, &root.join("g/x/c/1"), b"", Put::Fresh);
    assert_eq!(store.get(&root.join("g/x/c/1")).unwrap(), b"", "an empty object");
    assert_eq!(names(&*store, &root.join("g/x/c")), ["0", "1"]);
}

/// An object readers may hold is replaced whole (longer, then shorter), with no temporary
/// object left beside it; a second opener reads the same.
fn replacing_puts(open: Opener<'_>, _: Offers) {
    let (_b, store, root) = store_at(open, "a");
    let chunk = root.join("g/x/c/0");
    put(&*store, &chunk, &bytes(100, 2), Put::Replace);
    put(&*store, &chunk, &bytes(5000, 3), Put::Replace);
    put(&*store, &chunk, b"3 bytes", Put::Replace);
    assert_eq!(store.get(&chunk).unwrap(), b"3 bytes");
    assert_eq!(names(&*store, &root.join("g/x/c")), ["0"], "no temporary object is left");
    let (_again, other, _) = store_at(open, "a");
    assert_eq!(other.get(&chunk).unwrap(), b"3 bytes", "a second opener reads the same");
}

/// A metadata document is created, replaced by its writer again and again, and read back
/// whole, on a durable store too.
fn documents(open: Opener<'_>, _: Offers) {
    let (backend, store, root) = store_at(open, "a");
    let doc = root.join("g/zarr.json");
    for n in 0..3 {
        put(&*store, &doc, format!("{{\"shape\": [{n}]}}").as_bytes(), Put::Document);
    }
    assert_eq!(store.get(&doc).unwrap(), b"{\"shape\": [2]}");
    let durable = backend.store(true);
    put(&*durable, &root.join("zarr.json"), b"{}", Put::Document);
    put(&*durable, &root.join("zarr.json"), b"{\"attributes\": {}}", Put::Document);
    assert_eq!(store.get(&root.join("zarr.json")).unwrap(), b"{\"attributes\": {}}");
    assert_eq!(names(&*store, &root.join("g")), ["zarr.json"], "no temporary object is left");
}

/// Where the store writes into part of an object: at an offset of an object that does not
/// exist yet (bytes before it zeros), back to back from several buffers, the object made
/// at least `size` long, bytes not written kept; never truncated.
fn in_place(open: Opener<'_>, offers: Offers) {
    let (_b, store, root) = store_at(open, "a");
    assert_eq!(store.in_place().is_some(), offers.in_place, "writes in place");
    let Some(w) = store.in_place() else { return };
    let chunk = root.join("g/x/c/0");
    store.create_dir(&root.join("g/x/c")).unwrap();
    w.write_at(&chunk, 4, &[b"ab", b"", b"cde"], 16).unwrap();
    assert_eq!(store.get(&chunk).unwrap(), b"\0\0\0\0abcde\0\0\0\0\0\0\0");
    w.write_at(&chunk, 0, &[b"XY"], 8).unwrap();
    assert_eq!(store.get(&chunk).unwrap(), b"XY\0\0abcde\0\0\0\0\0\0\0", "neither truncated nor its other bytes touched");
    w.write_at(&chunk, 14, &[b"1234"], 0).unwrap();
    assert_eq!(store.get(&chunk).unwrap().len(), 18, "a write past the end extends it");
    assert_eq!(store.get_range(&chunk, 4..9).unwrap(), b"abcde");
    let big = bytes(3 << 20, 4);
    let pieces: Vec<&[u8]> = big.chunks(4096).collect();
    w.write_at(&root.join("g/x/c/1"), 0, &pieces, 0).unwrap();
    assert!(store.get(&root.join("g/x/c/1")).unwrap() == big, "many buffers, back to back");
}

/// Where the store streams objects: the pieces of one appear as one object at its finish,
/// nothing of it before; one dropped unfinished leaves nothing; a stream larger than the
/// store holds for one request (where the opener set that low) completes the same.
fn streams(open: Opener<'_>, offers: Offers) {
    let (_b, store, root) = store_at(open, "a");
    assert_eq!(store.streams(), offers.streams, "streams objects");
    if !offers.streams {
        assert!(store.stream(&root.join("g/x/c/0")).is_none(), "a store that does not stream starts none");
        return;
    }
    for (k, (count, size)) in [(3, 1000), (4, 40 << 10), (1, 0)].into_iter().enumerate() {
        let path = root.join(format!("g/x/c/{k}"));
        let mut up = store.stream(&path).unwrap().unwrap();
        let pieces: Vec<Vec<u8>> = (0..count).map(|p| bytes(size, p + k)).collect();
        for p in &pieces {
            up.push(p.clone()).unwrap();
        }
        assert!(!store.exists(&path), "nothing of a streamed object shows before its finish");
        up.finish().unwrap();
        assert!(store.get(&path).unwrap() == pieces.concat(), "stream {k}");
    }
    let gone = root.join("g/y/c/0");
    let mut up = store.stream(&gone).unwrap().unwrap();
    up.push(bytes(100 << 10, 9)).unwrap();
    drop(up);
    assert!(!store.exists(&gone), "a stream dropped unfinished leaves no object");
}

/// `create_dir` makes what puts below it need (again: no error); `exists` holds for objects
/// and for keys with objects below them, not for a key that only begins a name.
fn exists_and_create_dir(open: Opener<'_>, _: Offers) {
    let (_b, store, root) = store_at(open, "a");
    let dir = root.join("d/e");
    store.create_dir(&dir).unwrap();
    store.create_dir(&dir).unwrap();
    store.put(&dir.join("object"), b"x", Put::Fresh).unwrap();
    for p in ["d", "d/e", "d/e/object"] {
        assert!(store.exists(&root.join(p)), "{p} exists");
    }
    for p in ["d/e/obj", "d/e/object/below", "d/f", "e"] {
        assert!(!store.exists(&root.join(p)), "{p} does not exist");
    }
}

/// The names directly below a key: objects and the next part of deeper keys, each once, a
/// name that merely begins with another not mixed in; none below a key with nothing there.
fn listing(open: Opener<'_>, _: Offers) {
    let (_b, store, root) = store_at(open, "a");
    for key in ["g/zarr.json", "g/x/c/0", "g/x/c/1", "g/x/zarr.json", "g/x.step/c/0", "g/xy", "h"] {
        put(&*store, &root.join(key), key.as_bytes(), Put::Fresh);
    }
    assert_eq!(names(&*store, &root), ["g", "h"]);
    assert_eq!(names(&*store, &root.join("g")), ["x", "x.step", "xy", "zarr.json"]);
    assert_eq!(names(&*store, &root.join("g/x")), ["c", "zarr.json"]);
    assert_eq!(names(&*store, &root.join("g/x/c")), ["0", "1"]);
    assert!(names(&*store, &root.join("nothing")).is_empty());
}

/// Byte ranges read alone: the first bytes, the middle, a shard's index at the end; a
/// missing object is `NotFound`.
fn ranges(open: Opener<'_>, _: Offers) {
    let (_b, store, root) = store_at(open, "a");
    let shard = root.join("g/x/c/0");
    let data = bytes(1280, 5);
    put(&*store, &shard, &data, Put::Fresh);
    assert_eq!(store.get_range(&shard, 0..4).unwrap(), &data[..4]);
    assert_eq!(store.get_range(&shard, 300..317).unwrap(), &data[300..317]);
    assert_eq!(store.get_range(&shard, 1264..1280).unwrap(), &data[1264..]);
    assert_eq!(store.get(&root.join("g/x/c/9")).unwrap_err().kind(), io::ErrorKind::NotFound);
    assert_eq!(store.get_range(&root.join("g/x/c/9"), 0..4).unwrap_err().kind(), io::ErrorKind::NotFound);
}

/// An object, and everything below a key, removed; removing again, or what never was, is
/// no error; what only begins with the key's name stays.
fn removing_twice(open: Opener<'_>, _: Offers) {
    let (_b, store, root) = store_at(open, "a");
    for key in ["k/a", "k/b/c", "k/b/d", "kk", "k.step/c/0"] {
        put(&*store, &root.join(key), b"x", Put::Fresh);
    }
    for _ in 0..2 {
        store.remove(&root.join("k/a")).unwrap();
    }
    assert!(store.get(&root.join("k/a")).is_err());
    assert_eq!(names(&*store, &root.join("k")), ["b"]);
    for _ in 0..2 {
        store.remove(&root.join("k")).unwrap();
    }
    assert!(!store.exists(&root.join("k/b/c")) && !store.exists(&root.join("k")));
    store.remove(&root.join("never/was")).unwrap();
    assert_eq!(names(&*store, &root), ["k.step", "kk"], "what is not below the key stays");
}

fn errno(e: &RecordError) -> Option<i32> {
    match e {
        RecordError::Io { errno, .. } => *errno,
        _ => None,
    }
}

fn refused_busy(taken: Result<Box<dyn Held>, RecordError>, what: &str) -> RecordError {
    let e = taken.err().unwrap_or_else(|| panic!("{what}: taken while held"));
    assert_eq!(errno(&e), Some(libc::EBUSY), "{what}: {e}");
    assert!(e.to_string().contains("is locked: ") && e.to_string().contains("hostfeed.Recorder"), "{what}: {e}");
    e
}

const LEASE: Duration = Duration::from_secs(60);

/// The lock: taken, seen held by a second opener, refused to it naming the holder, released
/// when dropped and taken again; a shared store's leader admits the members of its run
/// only; a member without a leader is refused.
fn lock(open: Opener<'_>, _: Offers) {
    let (a, b) = (open("a"), open("a"));
    assert!(!a.is_held() && !b.is_held());
    let held = a.lock(LEASE, &Access::Exclusive).unwrap();
    assert!(b.is_held() && a.is_held());
    refused_busy(b.lock(LEASE, &Access::Exclusive), "a second exclusive lock");
    drop(held);
    assert!(!b.is_held(), "released when dropped");
    drop(b.lock(LEASE, &Access::Exclusive).unwrap());
    assert!(!a.is_held());

    let run = |g: &str| Access::SharedLeader { group: g.into() };
    let member = |g: &str| Access::SharedMember { group: g.into() };
    assert!(b.lock(LEASE, &member("run-1")).is_err(), "a member without its leader is refused");
    let leader = a.lock(LEASE, &run("run-1")).unwrap();
    let joined = b.lock(LEASE, &member("run-1")).unwrap();
    refused_busy(b.lock(LEASE, &member("run-2")), "a member of another run");
    refused_busy(b.lock(LEASE, &Access::Exclusive), "an exclusive lock of a shared store");
    drop(joined);
    assert!(a.is_held(), "a member leaves the lock to its leader");
    drop(leader);
    assert!(!a.is_held());
}

/// `prepare`: a fresh root for `Create`; refused (naming the holder, nothing touched)
/// while held; a recording there refused to `Create`, kept by `Append`, removed by
/// `Overwrite`; something that is not a recording refused to both.
fn prepare(open: Opener<'_>, _: Offers) {
    let (a, store, root) = store_at(open, "a");
    let held = a.prepare(Mode::Create, LEASE, &Access::Exclusive).unwrap();
    let mut attrs = serde_json::json!({"zarr_format": 3, "node_type": "group"});
    attrs["attributes"] = root_attributes();
    put(&*store, &root.join("zarr.json"), attrs.to_string().as_bytes(), Put::Document);
    put(&*store, &root.join("g/x/c/0"), b"rows", Put::Fresh);
    assert!(is_recording(&*store, &root));
    let b = open("a");
    refused_busy(b.prepare(Mode::Overwrite, LEASE, &Access::Exclusive), "prepare while held");
    assert_eq!(store.get(&root.join("g/x/c/0")).unwrap(), b"rows", "a refused prepare touches nothing");
    drop(held);
    let e = b.prepare(Mode::Create, LEASE, &Access::Exclusive).expect_err("Create over a recording");
    assert_eq!(errno(&e), Some(libc::EEXIST), "{e}");
    assert!(!b.is_held(), "a refused prepare holds nothing");
    let appended = b.prepare(Mode::Append { resume_after_step: None }, LEASE, &Access::Exclusive).unwrap();
    assert_eq!(store.get(&root.join("g/x/c/0")).unwrap(), b"rows", "Append keeps the recording");
    drop(appended);
    let replaced = b.prepare(Mode::Overwrite, LEASE, &Access::Exclusive).unwrap();
    assert!(!store.exists(&root.join("g")) && !is_recording(&*store, &root), "Overwrite removes the recording");
    drop(replaced);

    let (c, other, other_root) = store_at(open, "b");
    put(&*other, &other_root.join("notes.txt"), b"not a recording", Put::Fresh);
    for mode in [Mode::Create, Mode::Overwrite] {
        let e = c.prepare(mode, LEASE, &Access::Exclusive).expect_err("a root that is not a recording");
        assert_eq!(errno(&e), Some(libc::EEXIST), "{e}");
    }
    assert_eq!(other.get(&other_root.join("notes.txt")).unwrap(), b"not a recording");
}

/// An s3s-fs server on a free port of 127.0.0.1, serving a fresh temporary folder with one
/// bucket; stopped, and its folder removed, when dropped.
pub(crate) struct S3sFs {
    child: Child,
    dir: PathBuf,
    port: u16,
}

/// What the credentials are (s3s-fs takes what it is started with).
const KEY_ID: &str = "hostfeed-test-key-id";
const SECRET: &str = "hostfeed-test-secret-3f9a1c";

impl S3sFs {
    /// Starts s3s-fs with the bucket `bucket`; `None` (saying why on stderr) where there is
    /// no binary.
    ///
    /// # Panics
    /// No binary where `HOSTFEED_REQUIRE_S3S=1`; a server that does not answer in 30 s.
    pub(crate) fn start(bucket: &str) -> Option<S3sFs> {
        let binary = std::env::var_os("S3S_FS").map(PathBuf::from).or_else(|| {
            std::env::var_os("PATH")
                .and_then(|path| std::env::split_paths(&path).map(|d| d.join("s3s-fs")).find(|p| p.is_file()))
        });
        let Some(binary) = binary else {
            let why = "s3s-fs not found (cargo install s3s-fs --version 0.14.1 --features binary, or set S3S_FS)";
            assert!(std::env::var("HOSTFEED_REQUIRE_S3S").as_deref() != Ok("1"), "{why}, and HOSTFEED_REQUIRE_S3S=1");
            eprintln!("store conformance over s3s-fs skipped: {why}");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("hostfeed-s3s-{}-{bucket}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(bucket)).unwrap(); // a bucket is a folder there
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(&binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", KEY_ID, "--secret-key", SECRET])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut server = S3sFs { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let ended = server.child.try_wait().unwrap();
            assert!(ended.is_none() && Instant::now() < deadline, "s3s-fs did not start on port {port}: {ended:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    /// The storage options of a store on this server.
    pub(crate) fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", format!("http://127.0.0.1:{}", self.port)),
            ("aws_access_key_id", KEY_ID.into()),
            ("aws_secret_access_key", SECRET.into()),
            ("aws_region", "us-east-1".into()),
            ("aws_allow_http", "true".into()),
            // s3s-fs lacks S3's bulk DeleteObjects.
            ("aws_disable_bulk_delete", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

impl Drop for S3sFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
