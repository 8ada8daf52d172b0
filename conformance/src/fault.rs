//! A loopback TCP proxy a test controls, to cut a connection at the worst moment.
//!
//! Put it between a store client and its server, then arm one fault:
//!
//! - [`FaultProxy::cut_next_reply`]: the next client→server chunk that
//!   contains the given bytes is forwarded, the server's reply is swallowed
//!   and both sides are closed. The server may well have committed; the
//!   client must report an indeterminate result.
//! - [`FaultProxy::delay_next_request`]: the next client→server chunk that
//!   contains the given bytes is held back and the client's connection is
//!   closed at once (the client sees its request fail with no reply); the
//!   chunk reaches the server later, on the server connection that stays
//!   open. A commit then completes *after* the client was told its request
//!   failed; the client must report an indeterminate result and must not
//!   conclude anything from reads made before the late commit.
//!
//! Only loopback addresses are used.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Default)]
struct Control {
    /// Cut after forwarding a client chunk containing these bytes (empty = any chunk).
    armed: Option<Vec<u8>>,
    cuts: u64,
    /// Hold back the next client chunk containing these bytes (empty = any chunk) for this long.
    delay: Option<(Vec<u8>, Duration)>,
    /// Chunks held back so far, and how many of them were forwarded to the server.
    delays: u64,
    forwarded_late: u64,
    /// While a held chunk has not had its time on the server: its needle, and
    /// a flag that turns true once it has (or once the proxy stops).
    holding: Option<(Vec<u8>, watch::Receiver<bool>)>,
}

/// A TCP proxy on `127.0.0.1:<random port>` forwarding to one upstream.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    control: Arc<Mutex<Control>>,
    stop: watch::Sender<bool>,
}

impl FaultProxy {
    /// Start forwarding to `upstream` (e.g. `127.0.0.1:6379`).
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let control = Arc::new(Mutex::new(Control::default()));
        let (stop, stopped) = watch::channel(false);
        let ctl = control.clone();
        tokio::spawn(async move {
            let mut stopped_accept = stopped.clone();
            loop {
                tokio::select! {
                    _ = stopped_accept.changed() => break,
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { break };
                        let ctl = ctl.clone();
                        let stopped = stopped.clone();
                        tokio::spawn(async move {
                            if let Ok(server) = TcpStream::connect(upstream).await {
                                let _ = pipe(client, server, ctl, stopped).await;
                            }
                        });
                    }
                }
            }
        });
        Ok(FaultProxy {
            addr,
            control,
            stop,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Arm a cut: the next client chunk containing `needle` (any chunk when
    /// empty) is forwarded, then the reply is swallowed and the connection closed.
    pub fn cut_next_reply(&self, needle: &[u8]) {
        self.control.lock().unwrap().armed = Some(needle.to_vec());
    }

    /// How many connections were cut so far.
    pub fn cuts(&self) -> u64 {
        self.control.lock().unwrap().cuts
    }

    /// Arm a late delivery: the next client→server chunk containing `needle`
    /// (any chunk when empty; the needle may straddle two chunks) is not
    /// forwarded. The client's connection is closed at once, so the client
    /// sees its request fail with no reply. The held chunk is written to the
    /// server after `delay`, on the server connection, which then stays open
    /// for another `delay` (time for the server to execute it; its reply is
    /// read and dropped) before it is closed.
    ///
    /// Until then, a chunk containing `needle` on any other connection waits
    /// (that whole connection pauses, in both directions) so that a retry
    /// cannot overtake the late request; chunks without the needle pass, so
    /// the client can reconnect and read the state from before the late commit.
    ///
    /// On an HTTP/2 connection (gRPC, e.g. etcd) a request may span chunks
    /// and its server waits for the frame that ends the stream: the proxy
    /// follows the frame boundaries from the connection preface on, and holds
    /// back the client's bytes up to the first frame ending a stream
    /// (END_STREAM on DATA or HEADERS) at or after the matching chunk
    /// (reading them without forwarding, for at most `delay`) before it
    /// closes the client's connection. Other protocols: the matching chunk alone.
    ///
    /// Choose a needle that only the request to delay contains, and have no
    /// other request in flight on that connection: held bytes are held whole,
    /// with every other frame they carry, and the frames of the request that
    /// came in earlier chunks were already forwarded (the server waits for
    /// the rest). Bytes of a request's body (a key, a value) are sent as they
    /// are; header bytes may be compressed.
    pub fn delay_next_request(&self, needle: &[u8], delay: Duration) {
        self.control.lock().unwrap().delay = Some((needle.to_vec(), delay));
    }

    /// How many chunks were held back by [`FaultProxy::delay_next_request`] so far.
    pub fn delays(&self) -> u64 {
        self.control.lock().unwrap().delays
    }

    /// How many held-back chunks were (or are being) written to the server:
    /// counted just before the write, so a read that completed while this was
    /// still 0 cannot have seen their effect.
    pub fn forwarded_late(&self) -> u64 {
        self.control.lock().unwrap().forwarded_late
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame boundaries of the client→server bytes of an HTTP/2 connection, so
/// a held request can be held up to its end.
#[derive(Debug)]
enum H2Frames {
    /// Bytes of the connection preface seen so far.
    Preface(usize),
    /// The frame header read so far (9 bytes).
    Header(Vec<u8>),
    /// Payload bytes still to come, and whether the frame ends its stream.
    Payload { left: usize, ends_stream: bool },
    /// Not HTTP/2.
    Off,
}

impl H2Frames {
    fn is_h2(&self) -> bool {
        !matches!(self, H2Frames::Off)
    }

    /// Follow `bytes`; true when a frame ending a stream (END_STREAM on DATA
    /// or HEADERS) was completed by them.
    fn feed(&mut self, mut bytes: &[u8]) -> bool {
        let mut ended = false;
        loop {
            match self {
                H2Frames::Off => return false,
                H2Frames::Payload {
                    left: 0,
                    ends_stream,
                } => {
                    ended |= *ends_stream;
                    *self = H2Frames::Header(Vec::with_capacity(9));
                }
                _ if bytes.is_empty() => return ended,
                H2Frames::Preface(seen) => {
                    let want = &H2_PREFACE[*seen..];
                    let n = want.len().min(bytes.len());
                    if bytes[..n] != want[..n] {
                        *self = H2Frames::Off;
                        return false;
                    }
                    *seen += n;
                    bytes = &bytes[n..];
                    if *seen == H2_PREFACE.len() {
                        *self = H2Frames::Header(Vec::with_capacity(9));
                    }
                }
                H2Frames::Header(header) => {
                    let n = (9 - header.len()).min(bytes.len());
                    header.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if header.len() == 9 {
                        let left =
                            u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
                        // Frame types 0x0 DATA and 0x1 HEADERS; flag 0x1 END_STREAM.
                        let ends_stream = header[3] <= 0x1 && header[4] & 0x1 != 0;
                        *self = H2Frames::Payload { left, ends_stream };
                    }
                }
                H2Frames::Payload { left, .. } => {
                    let n = (*left).min(bytes.len());
                    *left -= n;
                    bytes = &bytes[n..];
                }
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// What to do with one client chunk.
enum Action {
    Forward,
    /// Forward, then swallow the reply and close.
    Cut,
    /// Hold it back, close the client, deliver it late.
    Hold(Duration, watch::Sender<bool>),
    /// Forward once the held request had its time on the server.
    Wait(watch::Receiver<bool>),
}

async fn pipe(
    mut client: TcpStream,
    mut server: TcpStream,
    control: Arc<Mutex<Control>>,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_server = vec![0u8; 64 * 1024];
    // The end of the previous client chunk, so a needle split across two
    // chunks is still found.
    let mut tail: Vec<u8> = Vec::new();
    let mut frames = H2Frames::Preface(0);
    let held = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        loop {
            tokio::select! {
                _ = stopped.changed() => return Ok(()),
                n = cr.read(&mut from_client) => {
                    let n = n?;
                    if n == 0 { return Ok(()); }
                    let chunk = &from_client[..n];
                    let request_ended = frames.feed(chunk);
                    let mut window = std::mem::take(&mut tail);
                    window.extend_from_slice(chunk);
                    let action = {
                        let mut c = control.lock().unwrap();
                        let cut = match &c.armed {
                            Some(needle) => contains(chunk, needle),
                            None => false,
                        };
                        let hold = match &c.delay {
                            Some((needle, _)) => contains(&window, needle),
                            None => false,
                        };
                        if cut {
                            c.armed = None;
                            c.cuts += 1;
                            Action::Cut
                        } else if hold {
                            let (needle, delay) = c.delay.take().expect("armed");
                            let (done, wait) = watch::channel(false);
                            c.holding = Some((needle, wait));
                            c.delays += 1;
                            Action::Hold(delay, done)
                        } else {
                            match &c.holding {
                                Some((needle, wait))
                                    if !*wait.borrow() && contains(&window, needle) =>
                                {
                                    Action::Wait(wait.clone())
                                }
                                _ => Action::Forward,
                            }
                        }
                    };
                    let keep = window.len().saturating_sub(64);
                    tail = window.split_off(keep);
                    match action {
                        Action::Forward => sw.write_all(chunk).await?,
                        Action::Cut => {
                            sw.write_all(chunk).await?;
                            // Let the server execute what it received, then drop both
                            // sides without passing its reply on.
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            return Ok(());
                        }
                        Action::Hold(delay, done) => {
                            let mut held = chunk.to_vec();
                            if frames.is_h2() && !request_ended {
                                // Take the rest of the request (not forwarded either).
                                let _ = tokio::time::timeout(delay, async {
                                    loop {
                                        match cr.read(&mut from_client).await {
                                            Ok(0) | Err(_) => break,
                                            Ok(n) => {
                                                held.extend_from_slice(&from_client[..n]);
                                                if frames.feed(&from_client[..n]) {
                                                    break;
                                                }
                                            }
                                        }
                                    }
                                })
                                .await;
                            }
                            break (held, delay, done);
                        }
                        Action::Wait(mut wait) => {
                            tokio::select! {
                                _ = stopped.changed() => return Ok(()),
                                _ = wait.wait_for(|done| *done) => {}
                            }
                            sw.write_all(chunk).await?;
                        }
                    }
                }
                n = sr.read(&mut from_server) => {
                    let n = n?;
                    if n == 0 { return Ok(()); }
                    cw.write_all(&from_server[..n]).await?;
                }
            }
        }
    };
    let (chunk, delay, done) = held;
    // The client's request fails now, with no reply.
    drop(client);
    tokio::select! {
        _ = stopped.changed() => {
            let _ = done.send(true);
            return Ok(());
        }
        _ = tokio::time::sleep(delay) => {}
    }
    control.lock().unwrap().forwarded_late += 1;
    let delivered = server.write_all(&chunk).await;
    // Give the server time to execute it; read and drop whatever it answers.
    let _ = tokio::time::timeout(delay, async {
        loop {
            tokio::select! {
                _ = stopped.changed() => break,
                n = server.read(&mut from_server) => match n {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                },
            }
        }
    })
    .await;
    let _ = done.send(true);
    delivered
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut out = vec![len[1], len[2], len[3], kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// The end of a request is found whatever the chunking, and only there.
    #[test]
    fn h2_frames_find_the_end_of_a_request_across_chunks() {
        let mut bytes = H2_PREFACE.to_vec();
        bytes.extend(frame(0x4, 0, 0, &[0; 6])); // SETTINGS
        bytes.extend(frame(0x1, 0x4, 1, b"headers")); // HEADERS, END_HEADERS only
        bytes.extend(frame(0x0, 0, 1, b"the key and the value")); // DATA
        bytes.extend(frame(0x8, 0, 0, &[0, 0, 1, 0])); // WINDOW_UPDATE (flag bits unrelated)
        let end = bytes.len();
        bytes.extend(frame(0x0, 0x1, 1, b"")); // empty DATA with END_STREAM
        for size in 1..=bytes.len() {
            let mut frames = H2Frames::Preface(0);
            let mut ended_at = None;
            for (i, chunk) in bytes.chunks(size).enumerate() {
                if frames.feed(chunk) {
                    assert!(ended_at.is_none(), "chunk size {size}: two ends");
                    ended_at = Some((i + 1) * size);
                }
            }
            let ended_at = ended_at.unwrap_or_else(|| panic!("chunk size {size}: end not found"));
            assert!(ended_at > end, "chunk size {size}: end found too early");
        }
        let mut not_h2 = H2Frames::Preface(0);
        assert!(!not_h2.feed(b"*1\r\n$4\r\nPING\r\n"));
        assert!(!not_h2.is_h2());
    }
}
