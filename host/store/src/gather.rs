//! A VFS over the platform's default that writes a commit's WAL frames in as few calls as it can.
//!
//! SQLite writes each WAL frame with two `pwrite`s, its 24-byte header and its page, so a lone
//! execution's commit (~60 frames) made ~120 system calls before its one sync, and on a VM a
//! call costs microseconds whatever its size (BENCHMARKS.md, "What a lone execution writes").
//! This VFS keeps a WAL file's appended bytes in memory and hands them to the default VFS in one
//! write (at most [`CHUNK`] bytes a call) when SQLite next does anything else with the file:
//! syncs it, reads it, truncates it, asks its size, controls or closes it, or writes elsewhere
//! in it. Every other file, and every call but an append to a WAL, goes straight through.
//!
//! It is only for connections whose commits sync the WAL (`synchronous=FULL`): SQLite syncs
//! the WAL before it publishes a commit's frames in the WAL index, and that sync is what writes
//! them out here, so no reader (other connections read the WAL through their own file handles,
//! finding frames through the index) can look for a frame still held in memory, and a commit
//! reaches the disk exactly as without this VFS. With `synchronous=NORMAL` nothing would flush
//! between the last frame and the index, so [`crate::Synchronous::Normal`] connections never
//! use it. A crash loses what is held, as it loses what is written but not synced: frames of a
//! transaction that never committed.
//!
//! A transaction larger than the page cache spills frames into the WAL before its commit, and
//! one that then rolls back makes no call on the WAL file: frames held then would outlive the
//! transaction and, written at this connection's next call, land on the frames another
//! connection had committed at the same offsets since. So each WAL file is linked to its
//! database file (`sqlite3_database_file_object`), whose shared-memory methods take and release
//! the WAL's write lock, and what a WAL holds is written before that lock is released: every
//! held byte reaches the file while its writer still owns the WAL, as SQLite itself writes it.
//! A WAL whose database file is not this VFS's (none is, in practice) is not held at all.
#![allow(unsafe_code)]

use rusqlite::ffi;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

/// The name a connection opens this VFS by.
pub(crate) const NAME: &CStr = c"capstan-gather";

/// The most one call writes: the unix VFS writes at most 128 KiB a call (`seekAndWriteFd`
/// masks the length with `0x1ffff`), and a write it cuts short is reported as a full disk.
const CHUNK: usize = 0x1f000;

/// Held bytes past this are written even before SQLite's next call (a large transaction).
const HOLD_AT_MOST: usize = 4 << 20;

/// An open file: SQLite allocates `szOsFile` bytes for it and reads only `base`.
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    /// The default VFS's file, allocated here with its own size.
    real: *mut ffi::sqlite3_file,
    /// Held appends to a WAL file (`None` for every other file).
    held: Option<Box<Held>>,
    /// A WAL file's database file, and a database file's open WAL (null when none): the
    /// database file's `xShmLock` releases the WAL's write lock, before which the WAL's held
    /// bytes are written. SQLite closes the WAL before its database file.
    link: *mut File,
}

/// The shared-memory lock a WAL's writer holds (`WAL_WRITE_LOCK` in SQLite's `wal.c`).
const WAL_WRITE_LOCK: c_int = 0;

struct Held {
    /// Where `bytes` start in the file.
    at: i64,
    bytes: Vec<u8>,
    /// Where the last write that went to the file ended: the next append starts there.
    end: i64,
}

/// The default VFS, and this one and its methods, built once and never freed (SQLite keeps
/// pointers to them for the life of the process).
struct Registered {
    default: *mut ffi::sqlite3_vfs,
    methods: *const ffi::sqlite3_io_methods,
}

// SAFETY: the pointers are to objects that live for the process and that SQLite reads from any
// thread (SQLite's own VFS objects are shared the same way).
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

static REGISTERED: OnceLock<Result<Registered, c_int>> = OnceLock::new();

/// Registers the VFS (not as the default) the first time; the result code when SQLite refuses.
pub(crate) fn register() -> Result<(), c_int> {
    let registered = REGISTERED.get_or_init(|| {
        // SAFETY: `sqlite3_vfs_find(NULL)` returns the default VFS, which SQLite never frees;
        // the copy and the method table are leaked, so they outlive every connection.
        unsafe {
            let default = ffi::sqlite3_vfs_find(ptr::null());
            if default.is_null() {
                return Err(ffi::SQLITE_ERROR);
            }
            let methods: &'static ffi::sqlite3_io_methods =
                Box::leak(Box::new(ffi::sqlite3_io_methods {
                    iVersion: 3,
                    xClose: Some(close),
                    xRead: Some(read),
                    xWrite: Some(write),
                    xTruncate: Some(truncate),
                    xSync: Some(sync),
                    xFileSize: Some(file_size),
                    xLock: Some(lock),
                    xUnlock: Some(unlock),
                    xCheckReservedLock: Some(check_reserved_lock),
                    xFileControl: Some(file_control),
                    xSectorSize: Some(sector_size),
                    xDeviceCharacteristics: Some(device_characteristics),
                    xShmMap: Some(shm_map),
                    xShmLock: Some(shm_lock),
                    xShmBarrier: Some(shm_barrier),
                    xShmUnmap: Some(shm_unmap),
                    xFetch: Some(fetch),
                    xUnfetch: Some(unfetch),
                }));
            // Every method but `xOpen` is the default's: they take the VFS only to read
            // settings the copy keeps (`mxPathname`, `pAppData`).
            let mut vfs = *default;
            vfs.szOsFile = std::mem::size_of::<File>() as c_int;
            vfs.zName = NAME.as_ptr();
            vfs.pNext = ptr::null_mut();
            vfs.xOpen = Some(open);
            let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
            let registered = Registered { default, methods };
            match ffi::sqlite3_vfs_register(vfs, 0) {
                ffi::SQLITE_OK => Ok(registered),
                code => Err(code),
            }
        }
    });
    registered.as_ref().map(drop).map_err(|code| *code)
}

fn registered() -> Option<&'static Registered> {
    REGISTERED.get().and_then(|r| r.as_ref().ok())
}

/// # Safety
/// `file` is a `File` this VFS opened (SQLite calls methods only on files whose `xOpen`
/// succeeded, and never one method concurrently with another on the same file).
unsafe fn parts<'a>(
    file: *mut ffi::sqlite3_file,
) -> (
    *mut ffi::sqlite3_file,
    &'a ffi::sqlite3_io_methods,
    Option<&'a mut Held>,
) {
    // SAFETY: as the caller promises; `real` was opened by the default VFS, so its methods
    // are set.
    unsafe {
        let file = &mut *file.cast::<File>();
        let real = file.real;
        (real, &*(*real).pMethods, file.held.as_deref_mut())
    }
}

/// Writes what `file` holds, if anything.
///
/// # Safety
/// As [`parts`].
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as the caller promises.
    let (real, methods, held) = unsafe { parts(file) };
    let Some(held) = held else {
        return ffi::SQLITE_OK;
    };
    let mut at = held.at;
    let mut code = ffi::SQLITE_OK;
    for chunk in held.bytes.chunks(CHUNK) {
        // SAFETY: the default VFS's own write, on its own file, with a live buffer.
        code = unsafe {
            match methods.xWrite {
                Some(method) => method(real, chunk.as_ptr().cast(), chunk.len() as c_int, at),
                None => ffi::SQLITE_IOERR,
            }
        };
        if code != ffi::SQLITE_OK {
            break;
        }
        at += chunk.len() as i64;
    }
    held.end = held.at + held.bytes.len() as i64;
    held.bytes.clear();
    code
}

/// Writes what the file holds, then runs `then` on the default VFS's file.
///
/// # Safety
/// As [`parts`].
unsafe fn after_flush(
    file: *mut ffi::sqlite3_file,
    then: impl FnOnce(*mut ffi::sqlite3_file, &ffi::sqlite3_io_methods) -> c_int,
) -> c_int {
    // SAFETY: as the caller promises.
    unsafe {
        let code = flush(file);
        if code != ffi::SQLITE_OK {
            return code;
        }
        let (real, methods, _) = parts(file);
        then(real, methods)
    }
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // `open` is reachable only through the registered VFS.
    let Some(registered) = registered() else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: SQLite gives `szOsFile` bytes at `file`; the default VFS's file gets the size it
    // asks for, zeroed as SQLite zeroes its own, and is freed if its open fails.
    unsafe {
        let ours = file.cast::<File>();
        (*ours).base.pMethods = ptr::null();
        let default = registered.default;
        let size = (*default).szOsFile;
        let real = ffi::sqlite3_malloc(size).cast::<ffi::sqlite3_file>();
        if real.is_null() {
            return ffi::SQLITE_NOMEM;
        }
        ptr::write_bytes(real.cast::<u8>(), 0, size as usize);
        let code = match (*default).xOpen {
            Some(method) => method(default, name, real, flags, out_flags),
            None => ffi::SQLITE_IOERR,
        };
        if (*real).pMethods.is_null() {
            ffi::sqlite3_free(real.cast());
            return if code == ffi::SQLITE_OK {
                ffi::SQLITE_ERROR
            } else {
                code
            };
        }
        // A WAL is held only when its database file is one of ours, whose write-lock release
        // writes what the WAL holds (the module comment).
        let database = if flags & ffi::SQLITE_OPEN_WAL != 0 {
            let database = ffi::sqlite3_database_file_object(name);
            (!database.is_null() && ptr::eq((*database).pMethods, registered.methods))
                .then(|| database.cast::<File>())
        } else {
            None
        };
        let held = database.map(|_| {
            Box::new(Held {
                at: 0,
                bytes: Vec::new(),
                end: -1,
            })
        });
        ptr::write(
            ours,
            File {
                base: ffi::sqlite3_file {
                    pMethods: registered.methods,
                },
                real,
                held,
                link: database.unwrap_or(ptr::null_mut()),
            },
        );
        if let Some(database) = database {
            (*database).link = ours;
        }
        code
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file once, and calls nothing on it after; `real` and `held` are
    // this file's own.
    unsafe {
        let flushed = flush(file);
        let (real, methods, _) = parts(file);
        let closed = match methods.xClose {
            Some(method) => method(real),
            None => ffi::SQLITE_IOERR,
        };
        ffi::sqlite3_free(real.cast());
        let ours = file.cast::<File>();
        let link = (*ours).link;
        if !link.is_null() && ptr::eq((*link).link, ours) {
            (*link).link = ptr::null_mut();
        }
        ptr::drop_in_place(ptr::addr_of_mut!((*ours).held));
        (*file).pMethods = ptr::null();
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: SQLite's file and a buffer of `amount` bytes it owns for the call.
    unsafe {
        let (real, methods, held) = parts(file);
        let Some(held) = held else {
            return match methods.xWrite {
                Some(method) => method(real, data, amount, offset),
                None => ffi::SQLITE_IOERR,
            };
        };
        let appends = if held.bytes.is_empty() {
            offset == held.end
        } else {
            offset == held.at + held.bytes.len() as i64
        };
        if !appends {
            // A write elsewhere (the WAL's header at a restart, a frame rewritten in place):
            // what is held goes first, then this, straight through.
            let code = flush(file);
            if code != ffi::SQLITE_OK {
                return code;
            }
            let (real, methods, held) = parts(file);
            let code = match methods.xWrite {
                Some(method) => method(real, data, amount, offset),
                None => ffi::SQLITE_IOERR,
            };
            if let Some(held) = held {
                held.end = offset + i64::from(amount);
            }
            return code;
        }
        if held.bytes.is_empty() {
            held.at = offset;
        }
        held.bytes.extend_from_slice(std::slice::from_raw_parts(
            data.cast::<u8>(),
            amount as usize,
        ));
        if held.bytes.len() > HOLD_AT_MOST {
            return flush(file);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: as `parts`; the read sees what was held.
    unsafe {
        after_flush(file, |real, m| match m.xRead {
            Some(method) => method(real, data, amount, offset),
            None => ffi::SQLITE_IOERR,
        })
    }
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        after_flush(file, |real, m| match m.xTruncate {
            Some(method) => method(real, size),
            None => ffi::SQLITE_IOERR,
        })
    }
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: as `parts`; what is held is written before the sync that makes it durable.
    unsafe {
        after_flush(file, |real, m| match m.xSync {
            Some(method) => method(real, flags),
            None => ffi::SQLITE_IOERR,
        })
    }
}

unsafe extern "C" fn file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    // SAFETY: as `parts`; the size counts what was held.
    unsafe {
        after_flush(file, |real, m| match m.xFileSize {
            Some(method) => method(real, size),
            None => ffi::SQLITE_IOERR,
        })
    }
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        after_flush(file, |real, m| match m.xFileControl {
            Some(method) => method(real, op, arg),
            None => ffi::SQLITE_IOERR,
        })
    }
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        let (real, m, _) = parts(file);
        match m.xLock {
            Some(method) => method(real, level),
            None => ffi::SQLITE_IOERR,
        }
    }
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        after_flush(file, |real, m| match m.xUnlock {
            Some(method) => method(real, level),
            None => ffi::SQLITE_IOERR,
        })
    }
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        let (real, m, _) = parts(file);
        match m.xCheckReservedLock {
            Some(method) => method(real, out),
            None => ffi::SQLITE_IOERR,
        }
    }
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        let (real, m, _) = parts(file);
        match m.xSectorSize {
            Some(method) => method(real),
            None => ffi::SQLITE_IOERR,
        }
    }
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        let (real, m, _) = parts(file);
        match m.xDeviceCharacteristics {
            Some(method) => method(real),
            None => ffi::SQLITE_IOERR,
        }
    }
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: as `parts`; the shared-memory methods are the database file's, never held.
    unsafe {
        let (real, m, _) = parts(file);
        match m.xShmMap {
            Some(method) => method(real, region, size, extend, out),
            None => ffi::SQLITE_IOERR,
        }
    }
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: as `parts`; `link` is this database file's open WAL, which SQLite calls only
    // from the same connection, so never concurrently with this.
    unsafe {
        let releases_write_lock = flags & ffi::SQLITE_SHM_UNLOCK != 0
            && offset <= WAL_WRITE_LOCK
            && WAL_WRITE_LOCK < offset + n;
        let wal = (*file.cast::<File>()).link;
        if releases_write_lock && !wal.is_null() {
            // A commit's sync wrote its frames already: anything still held is a rolled-back
            // transaction's spill, written here as SQLite would have written it, under the
            // lock. SQLite ignores what an unlock answers, so a failed write changes nothing
            // it does (the frames were never committed).
            flush(wal.cast());
        }
        let (real, m, _) = parts(file);
        match m.xShmLock {
            Some(method) => method(real, offset, n, flags),
            None => ffi::SQLITE_IOERR,
        }
    }
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: as `parts`.
    unsafe {
        let (real, m, _) = parts(file);
        if let Some(method) = m.xShmBarrier {
            method(real)
        }
    }
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        let (real, m, _) = parts(file);
        match m.xShmUnmap {
            Some(method) => method(real, delete),
            None => ffi::SQLITE_IOERR,
        }
    }
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: as `parts`; a mapped page sees what was held.
    unsafe {
        after_flush(file, |real, m| match m.xFetch {
            Some(method) => method(real, offset, amount, out),
            None => ffi::SQLITE_IOERR,
        })
    }
}

unsafe extern "C" fn unfetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    page: *mut c_void,
) -> c_int {
    // SAFETY: as `parts`.
    unsafe {
        let (real, m, _) = parts(file);
        match m.xUnfetch {
            Some(method) => method(real, offset, page),
            None => ffi::SQLITE_IOERR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    fn writer(path: &std::path::Path, cache_pages: i64) -> Connection {
        register().unwrap();
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let conn = Connection::open_with_flags_and_vfs(path, flags, NAME).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA cache_size = {cache_pages};
             CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS t_body ON t (body);"
        ))
        .unwrap();
        conn
    }

    fn assert_whole(conn: &Connection) {
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }

    fn count(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// Each commit is readable from another connection (on the default VFS, as the server's
    /// readers are) the moment it returns: its frames were written by its sync.
    #[test]
    fn a_commit_is_visible_to_other_connections_when_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let w = writer(&path, 2000);
        let r = Connection::open(&path).unwrap();
        for i in 0..200 {
            w.execute("INSERT INTO t (body) VALUES (?1)", [format!("row {i:05}")])
                .unwrap();
            assert_eq!(count(&r), i + 1);
        }
        assert_whole(&r);
    }

    /// What the WAL of `conn`'s main database holds in memory, in bytes.
    fn held(conn: &Connection) -> usize {
        let mut file: *mut ffi::sqlite3_file = ptr::null_mut();
        // SAFETY: `FILE_POINTER` writes the main database's file, which this VFS opened, and
        // the connection is not in use meanwhile.
        unsafe {
            let code = ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_FILE_POINTER,
                ptr::addr_of_mut!(file).cast(),
            );
            assert_eq!(code, ffi::SQLITE_OK);
            let wal = (*file.cast::<File>()).link;
            if wal.is_null() {
                return 0;
            }
            (*wal).held.as_ref().map_or(0, |h| h.bytes.len())
        }
    }

    /// Frames a rolled-back transaction spilled must not outlive it: another connection then
    /// appends its commits at the same offsets, and held frames written later would overwrite
    /// them. The transaction is rolled back at a moment its spill is still held, on a WAL
    /// nothing committed is read back from, and the rollback's release of the WAL write lock
    /// writes it.
    #[test]
    fn a_rolled_back_transaction_leaves_nothing_held_for_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let big = "x".repeat(3000);
        let w = writer(&path, 10);
        w.execute("INSERT INTO t (body) VALUES ('first')", [])
            .unwrap();
        assert_eq!(held(&w), 0, "a commit's sync writes what it held");
        // An empty WAL: the rollback then reads its pages back from the database file, not
        // the WAL, so no read writes the held frames out before the lock is released.
        w.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let tx = w.unchecked_transaction().unwrap();
        let mut spilled = false;
        for i in 0..2000 {
            tx.execute(
                "INSERT INTO t (body) VALUES (?1)",
                [format!("gone {i} {big}")],
            )
            .unwrap();
            if held(&tx) > 0 {
                spilled = true;
                break;
            }
        }
        assert!(spilled, "the transaction never left a spill held");
        tx.rollback().unwrap();
        assert_eq!(held(&w), 0, "the rollback left frames held");
        let other = Connection::open(&path).unwrap();
        for i in 0..300 {
            other
                .execute(
                    "INSERT INTO t (body) VALUES (?1)",
                    [format!("other {i} {big}")],
                )
                .unwrap();
        }
        // The writer touches the WAL again (a read, then a commit of its own).
        assert_eq!(count(&w), 301);
        w.execute("INSERT INTO t (body) VALUES ('last')", [])
            .unwrap();
        drop(other);
        drop(w);
        let r = Connection::open(&path).unwrap();
        assert_eq!(count(&r), 302);
        assert_whole(&r);
    }

    /// A transaction larger than the page cache spills frames into the WAL before its commit
    /// and rewrites some of them in place; one rolled back leaves frames the next overwrites.
    /// Both leave a database that checks whole, read from another connection while the writer
    /// is open and from a fresh one after it closed.
    #[test]
    fn spilled_rewritten_and_rolled_back_frames_leave_a_whole_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let big = "x".repeat(3000);
        {
            let w = writer(&path, 10);
            let tx = w.unchecked_transaction().unwrap();
            for i in 0..2000 {
                tx.execute(
                    "INSERT INTO t (body) VALUES (?1)",
                    [format!("{i:05} {big}")],
                )
                .unwrap();
            }
            tx.execute("UPDATE t SET body = 'u' || body WHERE id % 7 = 0", [])
                .unwrap();
            tx.commit().unwrap();
            let tx = w.unchecked_transaction().unwrap();
            for i in 0..1000 {
                tx.execute(
                    "INSERT INTO t (body) VALUES (?1)",
                    [format!("gone {i} {big}")],
                )
                .unwrap();
            }
            tx.rollback().unwrap();
            for i in 0..50 {
                w.execute("INSERT INTO t (body) VALUES (?1)", [format!("after {i}")])
                    .unwrap();
            }
            let r = Connection::open(&path).unwrap();
            assert_eq!(count(&r), 2050);
        }
        let r = Connection::open(&path).unwrap();
        assert_eq!(count(&r), 2050);
        let updated: i64 = r
            .query_row("SELECT count(*) FROM t WHERE body LIKE 'u%'", [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(updated, 2000 / 7);
        assert_whole(&r);
    }
}
