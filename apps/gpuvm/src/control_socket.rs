//! The control socket's server (`DIR/control.sock`): binds it owner-only, accepts at most
//! [`MAX_CONNECTIONS`] connections at once, reads bounded JSON lines and answers each through
//! [`Control`]; the two streaming verbs (`migrate_out`, `restore`) hand the connection to
//! [`crate::serve_migrate`]. Apart from `control` (the protocol and its state) so that the
//! verbs' handlers can use the protocol without the protocol naming them.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::control::{Control, Request, MAX_LINE};

/// Reads one line of at most [`MAX_LINE`] bytes; `None` at end of stream.
fn read_line(r: &mut impl BufRead) -> io::Result<Option<Result<String, String>>> {
    let mut buf = Vec::new();
    let n = r.take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.len() > MAX_LINE {
        return Ok(Some(Err(format!(
            "request longer than {MAX_LINE} bytes; connection closed"
        ))));
    }
    Ok(Some(
        String::from_utf8(buf).map_err(|_| "request is not UTF-8".to_string()),
    ))
}

/// Serves one control connection (requests until it closes; 60 s idle timeout). A
/// `migrate_out` or `restore` request hands the connection to [`crate::serve_migrate`], which
/// ends it.
fn serve_conn(ctl: &Control, stream: UnixStream) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.set_write_timeout(Some(crate::serve_migrate::TIMEOUT))?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    while let Some(line) = read_line(&mut r)? {
        let (reply, close) = match line {
            Ok(l) if l.trim().is_empty() => continue,
            Ok(l) => match serde_json::from_str::<Request>(l.trim_end()) {
                Ok(Request::MigrateOut { name }) => {
                    ctl.requests.fetch_add(1, Ordering::Relaxed);
                    r.get_ref()
                        .set_read_timeout(Some(crate::serve_migrate::TIMEOUT))?;
                    return crate::serve_migrate::serve_session(ctl, &name, &mut r, &mut w);
                }
                Ok(Request::Restore { name, bytes }) => {
                    ctl.requests.fetch_add(1, Ordering::Relaxed);
                    r.get_ref()
                        .set_read_timeout(Some(crate::serve_migrate::TIMEOUT))?;
                    return crate::serve_migrate::serve_restore(ctl, &name, bytes, &mut r, &mut w);
                }
                parsed => (ctl.respond(parsed), false),
            },
            Err(e) => {
                ctl.requests.fetch_add(1, Ordering::Relaxed);
                (ctl.refuse(e), true)
            }
        };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        w.write_all(&out)?;
        if close {
            break;
        }
    }
    Ok(())
}

/// Binds `DIR/control.sock` with mode 0600 (the umask is narrowed around the bind, so the
/// socket is never reachable with wider permissions). Call before other threads start.
pub fn bind(dir: &Path) -> io::Result<(UnixListener, PathBuf)> {
    let path = dir.join("control.sock");
    if path.exists() {
        // The caller holds the directory's lock: a socket left here is a dead daemon's.
        std::fs::remove_file(&path)?;
    }
    // SAFETY: umask only changes this process's file mode mask; no other thread runs yet.
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(&path);
    // SAFETY: as above, restoring it.
    unsafe { libc::umask(old) };
    Ok((l?, path))
}

/// Most control connections served at once (a migration session holds one for its length).
pub const MAX_CONNECTIONS: usize = 8;

/// Serves the control socket until the process ends: each connection in its own thread, at
/// most [`MAX_CONNECTIONS`] at once (more wait to be accepted).
pub fn serve(ctl: Arc<Control>, listener: UnixListener) {
    let slots = Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                {
                    let (n, cv) = &*slots;
                    let mut n = n.lock().unwrap_or_else(|e| e.into_inner());
                    while *n >= MAX_CONNECTIONS {
                        n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
                    }
                    *n += 1;
                }
                let (ctl, held) = (ctl.clone(), slots.clone());
                let spawned = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_conn(&ctl, s) {
                            log::info!("control connection ended: {e}");
                        }
                        let (n, cv) = &*held;
                        *n.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                        cv.notify_one();
                    });
                if let Err(e) = spawned {
                    log::warn!("control connection thread: {e}");
                    let (n, _) = &*slots;
                    *n.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                }
            }
            Err(e) => {
                log::warn!("control socket accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
