//! A loopback TCP proxy a test controls, to cut a connection at the worst moment.
//!
//! Put it between a store client and its server, then [`FaultProxy::cut_next_reply`]:
//! the next client→server chunk that contains the given bytes is forwarded,
//! the server's reply is swallowed and both sides are closed. The server may
//! well have committed; the client must report an indeterminate result.
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
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn pipe(
    mut client: TcpStream,
    mut server: TcpStream,
    control: Arc<Mutex<Control>>,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_server = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            _ = stopped.changed() => return Ok(()),
            n = cr.read(&mut from_client) => {
                let n = n?;
                if n == 0 { return Ok(()); }
                sw.write_all(&from_client[..n]).await?;
                let cut = {
                    let mut c = control.lock().unwrap();
                    let hit = match &c.armed {
                        Some(needle) => needle.is_empty()
                            || from_client[..n].windows(needle.len()).any(|w| w == needle.as_slice()),
                        None => false,
                    };
                    if hit { c.armed = None; c.cuts += 1; }
                    hit
                };
                if cut {
                    // Let the server execute what it received, then drop both
                    // sides without passing its reply on.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return Ok(());
                }
            }
            n = sr.read(&mut from_server) => {
                let n = n?;
                if n == 0 { return Ok(()); }
                cw.write_all(&from_server[..n]).await?;
            }
        }
    }
}
