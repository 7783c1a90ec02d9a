//! The control socket's two streaming verbs, which move a VM's vGPU between `gpuvm serve`
//! daemons while the VM's VMM moves the rest of the guest (`docs/serve.md` has the protocol,
//! `docs/migration.md` the whole move):
//!
//! - `{"cmd":"migrate_out","name":VM}` turns the connection into a migration session of that
//!   VM's vGPU (`gpuvm_vfio_user::MigrationOut`). Each reply is one JSON line with `"bytes":N`
//!   followed by N bytes of the vGPU's `gpuvm::migrate` stream (the first reply carries its
//!   header). Then, one JSON line each: `{"op":"round"}` (VRAM pages while the guest runs),
//!   `{"op":"stop","max_wait_ms":M}` (the VMM has paused the vCPUs: quiesce, last pages,
//!   device state, the guest-RAM pages the GPU could have written by DMA), `{"op":"commit"}`
//!   (the destination has the guest: the session ends and the vGPU stays quiesced until its
//!   client goes) or `{"op":"abort"}`. A session that ends any other way — the connection
//!   closes, times out or sends something else — resumes the vGPU: the guest goes on here.
//! - `{"cmd":"restore","name":VM,"bytes":N}` followed by N bytes of such a stream rebuilds the
//!   VM's vGPU with the RAM its (new, connected) client mapped; the client's connection adopts
//!   it (`VmDevice::restore_from`).
//!
//! Both sides are here: the daemon's handlers and the VMM's client ([`Session`], [`restore`]).
//! Everything read is bounded and checked on both sides.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use gpuvm::migrate::{RoundStats, StopStats};
use serde::{Deserialize, Serialize};

use crate::control::Control;

/// Largest vGPU stream a restore takes (as the KVM migration's destination does).
pub const MAX_STREAM: u64 = 8 << 30;
/// Longest reply line the client reads (a stop's DMA page list for 8 GiB of RAM fits).
const MAX_REPLY_LINE: u64 = 64 << 20;
/// How long either side waits for the other between messages.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// One step of a migration session.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum SessionOp {
    /// One round of VRAM pages.
    Round,
    /// Quiesce, the last pages, the device state.
    Stop {
        /// How long quiescing may wait for the VM's work on the GPU, ms (at most 60 000).
        max_wait_ms: u64,
    },
    /// The destination has the guest.
    Commit,
    /// Give up: the vGPU resumes.
    Abort,
}

/// The JSON line before a piece of stream.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Piece {
    /// Stream bytes that follow the line.
    #[serde(default)]
    pub bytes: u64,
    /// The round's figures (`round`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<RoundStats>,
    /// The stop's figures (`stop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopStats>,
}

fn reply(w: &mut impl Write, v: serde_json::Value, data: &[u8]) -> io::Result<()> {
    let mut line = serde_json::to_vec(&v)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.write_all(data)?;
    w.flush()
}

fn ok_piece(p: &Piece) -> serde_json::Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("ok".into(), true.into());
    }
    v
}

/// Serves a `migrate_out` session on the connection (the daemon's side). Returns when the
/// session ends; the connection is then closed by the caller.
pub fn serve_session(
    ctl: &Control,
    name: &str,
    r: &mut impl BufRead,
    w: &mut impl Write,
) -> io::Result<()> {
    let dev = match ctl.daemon().device(name) {
        Some(d) => d,
        None => return reply(w, ctl.refuse(format!("no VM named '{name}'")), &[]),
    };
    let mut mig = match dev.migrate_out() {
        Ok(m) => m,
        Err(e) => return reply(w, ctl.refuse(e), &[]),
    };
    let header = mig.take();
    reply(
        w,
        ok_piece(&Piece {
            bytes: header.len() as u64,
            ..Piece::default()
        }),
        &header,
    )?;
    let clock = gpuvm::clock::ClockKind::Real.create();
    loop {
        let mut line = String::new();
        let n = r.take(4096).read_line(&mut line)?;
        if n == 0 {
            dev.event("migration session: the VMM closed the connection");
            return Ok(());
        }
        let op = match serde_json::from_str::<SessionOp>(line.trim_end()) {
            Ok(op) => op,
            Err(e) => {
                // Framing cannot be trusted after a bad line: end the session (resuming).
                return reply(w, ctl.refuse(format!("migration session: {e}")), &[]);
            }
        };
        let (piece, data) = match op {
            SessionOp::Round => match mig.round() {
                Ok(rs) => (
                    Piece {
                        round: Some(rs),
                        ..Piece::default()
                    },
                    mig.take(),
                ),
                Err(e) => return reply(w, ctl.refuse(e), &[]),
            },
            SessionOp::Stop { max_wait_ms } => {
                let wait = max_wait_ms.min(60_000) * 1_000_000;
                match mig.stop(&*clock, wait) {
                    Ok(st) => (
                        Piece {
                            stop: Some(st),
                            ..Piece::default()
                        },
                        mig.take(),
                    ),
                    Err(e) => return reply(w, ctl.refuse(e), &[]),
                }
            }
            SessionOp::Commit => {
                mig.commit();
                return reply(w, serde_json::json!({"ok": true, "committed": true}), &[]);
            }
            SessionOp::Abort => {
                drop(mig);
                return reply(w, serde_json::json!({"ok": true, "aborted": true}), &[]);
            }
        };
        let mut piece = piece;
        piece.bytes = data.len() as u64;
        reply(w, ok_piece(&piece), &data)?;
    }
}

/// Serves a `restore` (the daemon's side): reads the `bytes` that follow the request, then
/// rebuilds the VM's vGPU from them.
pub fn serve_restore(
    ctl: &Control,
    name: &str,
    bytes: u64,
    r: &mut impl BufRead,
    w: &mut impl Write,
) -> io::Result<()> {
    if bytes > MAX_STREAM {
        // The bytes cannot be skipped safely: refuse and close.
        return reply(
            w,
            ctl.refuse(format!(
                "restore of {bytes} bytes: at most {MAX_STREAM} are taken"
            )),
            &[],
        );
    }
    let mut stream = Vec::new();
    r.take(bytes).read_to_end(&mut stream)?;
    if (stream.len() as u64) < bytes {
        return reply(
            w,
            ctl.refuse(format!(
                "restore: the connection ended after {} of {bytes} bytes",
                stream.len()
            )),
            &[],
        );
    }
    let Some(dev) = ctl.daemon().device(name) else {
        return reply(w, ctl.refuse(format!("no VM named '{name}'")), &[]);
    };
    match dev.restore_from(&stream) {
        Ok(v) => reply(
            w,
            serde_json::json!({"ok": true, "restored": name, "vgpu": v.id().to_string()}),
            &[],
        ),
        Err(e) => reply(w, ctl.refuse(e), &[]),
    }
}

// ---------------------------------------------------------------------------------------------
// The VMM's side

fn connect(dir: &Path) -> anyhow::Result<UnixStream> {
    let path = dir.join("control.sock");
    let s = UnixStream::connect(&path).with_context(|| {
        format!(
            "reaching the daemon's control socket {} (the vGPU's socket must be in the directory of a running `gpuvm serve`)",
            path.display()
        )
    })?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    Ok(s)
}

/// Reads one reply: its JSON line (refusals become errors) and the bytes that follow it.
fn read_reply(r: &mut impl BufRead, what: &str) -> anyhow::Result<(serde_json::Value, Vec<u8>)> {
    let mut line = Vec::new();
    r.take(MAX_REPLY_LINE).read_until(b'\n', &mut line)?;
    ensure!(
        line.ends_with(b"\n"),
        "{what}: the daemon's reply is cut or longer than {MAX_REPLY_LINE} bytes"
    );
    let v: serde_json::Value = serde_json::from_slice(&line)
        .with_context(|| format!("{what}: the daemon's reply is not JSON"))?;
    if v.get("ok") != Some(&serde_json::Value::Bool(true)) {
        bail!(
            "{what}: the daemon refused: {}",
            v.get("error").and_then(|e| e.as_str()).unwrap_or("?")
        );
    }
    let n = v.get("bytes").and_then(|b| b.as_u64()).unwrap_or(0);
    ensure!(
        n <= MAX_STREAM,
        "{what}: the daemon announced {n} bytes, more than {MAX_STREAM}"
    );
    let mut data = Vec::new();
    r.take(n).read_to_end(&mut data)?;
    ensure!(
        data.len() as u64 == n,
        "{what}: the connection ended after {} of {n} bytes",
        data.len()
    );
    Ok((v, data))
}

/// A migration session with a daemon (the VMM's side of `migrate_out`). Dropped before
/// [`Session::commit`], it tells the daemon to resume the vGPU (closing the connection does
/// too).
pub struct Session {
    r: BufReader<UnixStream>,
    w: UnixStream,
    /// Stream bytes received and not yet taken.
    pending: Vec<u8>,
    open: bool,
}

impl Session {
    /// Opens a session on VM `name` of the daemon serving `dir`; its first bytes (the
    /// stream's header) are pending.
    pub fn open(dir: &Path, name: &str) -> anyhow::Result<Session> {
        let w = connect(dir)?;
        let mut r = BufReader::new(w.try_clone()?);
        let mut req = serde_json::to_vec(&crate::control::Request::MigrateOut {
            name: name.to_string(),
        })?;
        req.push(b'\n');
        (&w).write_all(&req)?;
        let (_, header) = read_reply(&mut r, "starting the vGPU's migration")?;
        Ok(Session {
            r,
            w,
            pending: header,
            open: true,
        })
    }

    fn op(&mut self, op: &SessionOp, what: &str) -> anyhow::Result<Piece> {
        ensure!(self.open, "{what}: the session has ended");
        let mut line = serde_json::to_vec(op)?;
        line.push(b'\n');
        let sent = (&self.w).write_all(&line);
        if let Err(e) = sent {
            self.open = false;
            bail!("{what}: {e}");
        }
        match read_reply(&mut self.r, what) {
            Ok((v, data)) => {
                let piece: Piece = serde_json::from_value(v)
                    .with_context(|| format!("{what}: the daemon's reply"))?;
                self.pending.extend(data);
                Ok(piece)
            }
            Err(e) => {
                // A refused step ends the session on the daemon's side (it resumed the vGPU).
                self.open = false;
                Err(e)
            }
        }
    }

    /// Stream bytes received since the last call.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }

    /// One VRAM round.
    pub fn round(&mut self) -> anyhow::Result<RoundStats> {
        self.op(&SessionOp::Round, "a VRAM round")?
            .round
            .context("a VRAM round: the reply has no figures")
    }

    /// The stop (the vCPUs are paused).
    pub fn stop(&mut self, max_wait_ms: u64) -> anyhow::Result<StopStats> {
        self.op(&SessionOp::Stop { max_wait_ms }, "the vGPU's stop")?
            .stop
            .context("the vGPU's stop: the reply has no figures")
    }

    /// The destination has the guest: the daemon keeps the vGPU quiesced.
    pub fn commit(mut self) -> anyhow::Result<()> {
        self.op(&SessionOp::Commit, "committing the migration")?;
        self.open = false;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.open {
            // Best effort: the daemon resumes on a closed connection too.
            let _ = self.op(&SessionOp::Abort, "aborting the migration");
        }
    }
}

/// Restores VM `name` of the daemon serving `dir` from `stream` (the VM's new client must be
/// connected with its RAM mapped). Returns the new vGPU's id.
pub fn restore(dir: &Path, name: &str, stream: &[u8]) -> anyhow::Result<String> {
    let s = connect(dir)?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut req = serde_json::to_vec(&crate::control::Request::Restore {
        name: name.to_string(),
        bytes: stream.len() as u64,
    })?;
    req.push(b'\n');
    (&s).write_all(&req)?;
    (&s).write_all(stream)?;
    let (v, _) = read_reply(&mut r, "restoring the vGPU in the daemon")?;
    Ok(v.get("vgpu")
        .and_then(|x| x.as_str())
        .unwrap_or_default()
        .to_string())
}
