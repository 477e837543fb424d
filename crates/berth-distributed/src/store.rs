//! `TcpStore`: a key-value store over TCP that every rank reaches at `MASTER_ADDR:MASTER_PORT`,
//! hosted by rank 0, after PyTorch's `TCPStore`
//! (<https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.TCPStore>).
//!
//! Note [Store protocol]: one request, one reply, over one connection per client; every field
//! is a `u32` little-endian byte count and the bytes. Requests start with an opcode byte:
//! `SET key value` (reply: one acknowledgement byte, so that a value set is visible to every
//! client once `set` returns), `GET key` (reply: a presence byte, then the value), `ADD key i64` (reply:
//! the new value, as PyTorch's `add`, creating the key at 0), `SET_IF_ABSENT key value` (reply:
//! the value now stored, as PyTorch's `compare_set` with an empty expected value), `DELETE key`
//! (reply: a byte, 1 when the key existed, as PyTorch's `delete_key`). Waiting for a
//! key is done by the client, polling `GET` every [`POLL_INTERVAL`] until its timeout:
//! PyTorch's store waits on the server instead, which saves the polls but needs a per-key
//! waiter list; a rendezvous of a few ranks polls a handful of keys for a few seconds, so the
//! simpler protocol is kept. The store is for rendezvous metadata (ids, counters, errors), not
//! for tensors: values are at most [`MAX_VALUE_BYTES`].

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{DistError, Result};

/// How often a waiting client asks the store again (Note [Store protocol]).
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The largest key or value the store accepts, in bytes (1 MiB).
pub const MAX_VALUE_BYTES: usize = 1 << 20;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const OP_SET_IF_ABSENT: u8 = 4;
const OP_DELETE: u8 = 5;

type Map = Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>;

/// The store's host side: a listening thread and one thread per client. Rank 0 holds it for
/// the job's lifetime; dropping it stops accepting and closes every client connection.
#[derive(Debug)]
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    clients: Arc<Mutex<Vec<TcpStream>>>,
    listener: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Listens on `addr` (`"0.0.0.0:29500"`; port 0 picks a free port, see
    /// [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    /// [`DistError::Listen`] when the address cannot be bound (the port is in use).
    pub fn bind(addr: &str) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|source| DistError::Listen {
            addr: addr.to_string(),
            source,
        })?;
        let local = listener.local_addr().map_err(|source| DistError::Listen {
            addr: addr.to_string(),
            source,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let map: Map = Arc::default();
        let handle = {
            let (stop, clients) = (stop.clone(), clients.clone());
            std::thread::Builder::new()
                .name("berth-store".into())
                .spawn(move || accept_loop(listener, stop, clients, map))
                .map_err(|source| DistError::Listen {
                    addr: addr.to_string(),
                    source,
                })?
        };
        Ok(StoreServer {
            addr: local,
            stop,
            clients,
            listener: Some(handle),
        })
    }

    /// The address the store listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call; it then sees `stop`. A failed connect means the listener is
        // already gone, which is what we want.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        drop(TcpStream::connect_timeout(&wake, Duration::from_secs(1)));
        for c in self
            .clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            // Ends the client threads' reads; a socket already closed has nothing to end.
            drop(c.shutdown(Shutdown::Both));
        }
        if let Some(h) = self.listener.take() {
            // The accept loop does not panic; a panic there would already have been printed.
            drop(h.join());
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    clients: Arc<Mutex<Vec<TcpStream>>>,
    map: Map,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        if let Ok(copy) = conn.try_clone() {
            clients
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(copy);
        }
        let map = map.clone();
        // A client whose thread cannot start is dropped; it sees its connection close.
        drop(
            std::thread::Builder::new()
                .name("berth-store-client".into())
                .spawn(move || serve(conn, map)),
        );
    }
}

/// Serves one client until it disconnects or sends something malformed.
fn serve(mut conn: TcpStream, map: Map) {
    while let Ok(reply) = serve_one(&mut conn, &map) {
        if conn.write_all(&reply).is_err() {
            return;
        }
    }
}

fn serve_one(conn: &mut TcpStream, map: &Map) -> std::io::Result<Vec<u8>> {
    let mut op = [0u8; 1];
    conn.read_exact(&mut op)?;
    let key = read_field(conn)?;
    // The whole request is read before the map is locked: a slow client holds up no other.
    let body = match op[0] {
        OP_SET | OP_SET_IF_ABSENT => read_field(conn)?,
        OP_ADD => {
            let mut delta = vec![0u8; 8];
            conn.read_exact(&mut delta)?;
            delta
        }
        OP_GET | OP_DELETE => Vec::new(),
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "unknown opcode",
            ))
        }
    };
    let mut reply = Vec::new();
    let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
    match op[0] {
        OP_SET => {
            map.insert(key, body);
            reply.push(1);
        }
        OP_GET => match map.get(&key) {
            Some(v) => {
                reply.push(1);
                put_field(&mut reply, v);
            }
            None => reply.push(0),
        },
        OP_DELETE => reply.push(u8::from(map.remove(&key).is_some())),
        OP_ADD => {
            let delta = <[u8; 8]>::try_from(body.as_slice()).map_or(0, i64::from_le_bytes);
            let current = map
                .get(&key)
                .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
                .map_or(0, i64::from_le_bytes);
            let new = current.wrapping_add(delta);
            map.insert(key, new.to_le_bytes().to_vec());
            reply.extend_from_slice(&new.to_le_bytes());
        }
        _ => {
            let now = map.entry(key).or_insert(body);
            put_field(&mut reply, now);
        }
    }
    Ok(reply)
}

fn read_field(conn: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    conn.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_VALUE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("field of {len} bytes exceeds the store's {MAX_VALUE_BYTES}"),
        ));
    }
    let mut buf = vec![0u8; len];
    conn.read_exact(&mut buf)?;
    Ok(buf)
}

fn put_field(out: &mut Vec<u8>, bytes: &[u8]) {
    // Fields are at most MAX_VALUE_BYTES (checked by the client and the reader), so fit a u32.
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A client of a [`StoreServer`]: one TCP connection, requests one at a time.
#[derive(Debug)]
pub struct TcpStore {
    addr: String,
    conn: Mutex<TcpStream>,
}

impl TcpStore {
    /// Connects to the store at `addr` (`"host:port"`), retrying every [`POLL_INTERVAL`]
    /// until `timeout`: rank 0 may start after the others, as with PyTorch's `TCPStore`.
    ///
    /// # Errors
    /// [`DistError::ConnectTimeout`] when no connection succeeded within `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Self> {
        let start = Instant::now();
        loop {
            let attempt = addr.to_socket_addrs().and_then(|mut addrs| {
                let a = addrs.next().ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotFound, "address resolves to nothing")
                })?;
                TcpStream::connect_timeout(&a, timeout.max(Duration::from_millis(100)))
            });
            match attempt {
                Ok(conn) => {
                    // Requests are small; send each at once.
                    drop(conn.set_nodelay(true));
                    return Ok(TcpStore {
                        addr: addr.to_string(),
                        conn: Mutex::new(conn),
                    });
                }
                Err(last_error) if start.elapsed() >= timeout => {
                    return Err(DistError::ConnectTimeout {
                        addr: addr.to_string(),
                        timeout,
                        last_error,
                    })
                }
                Err(_) => std::thread::sleep(POLL_INTERVAL),
            }
        }
    }

    /// The store's address, as given to [`connect`](Self::connect).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn request(&self, op: u8, key: &str, body: &[u8], reply_fixed: usize) -> Result<Vec<u8>> {
        if key.len() > MAX_VALUE_BYTES || body.len() > MAX_VALUE_BYTES + 4 {
            return Err(DistError::Protocol {
                addr: self.addr.clone(),
                what: format!("a key or value over {MAX_VALUE_BYTES} bytes cannot be stored"),
            });
        }
        let io = |source| DistError::Io {
            addr: self.addr.clone(),
            source,
        };
        let mut msg = vec![op];
        put_field(&mut msg, key.as_bytes());
        msg.extend_from_slice(body);
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        conn.write_all(&msg).map_err(io)?;
        match op {
            OP_SET | OP_DELETE => {
                // The acknowledgement: once `set` returns, every client sees the value (once
                // `delete_key` returns, none does); for a delete it says whether the key existed.
                let mut ack = [0u8; 1];
                conn.read_exact(&mut ack).map_err(io)?;
                Ok(ack.to_vec())
            }
            OP_ADD => {
                let mut buf = vec![0u8; reply_fixed];
                conn.read_exact(&mut buf).map_err(io)?;
                Ok(buf)
            }
            OP_GET => {
                let mut present = [0u8; 1];
                conn.read_exact(&mut present).map_err(io)?;
                match present[0] {
                    0 => Ok(Vec::new()),
                    1 => {
                        let mut v = read_field(&mut *conn).map_err(io)?;
                        v.insert(0, 1);
                        Ok(v)
                    }
                    b => Err(DistError::Protocol {
                        addr: self.addr.clone(),
                        what: format!("presence byte {b}, expected 0 or 1"),
                    }),
                }
            }
            _ => read_field(&mut *conn).map_err(io),
        }
    }

    /// Stores `value` under `key` (PyTorch's `set`).
    ///
    /// # Errors
    /// [`DistError::Io`] when the store is gone; [`DistError::Protocol`] for a key or value
    /// over [`MAX_VALUE_BYTES`].
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut body = Vec::with_capacity(value.len() + 4);
        put_field(&mut body, value);
        self.request(OP_SET, key, &body, 0).map(drop)
    }

    /// Removes `key`; returns whether it was set (PyTorch's `delete_key`).
    ///
    /// # Errors
    /// As [`set`](Self::set).
    pub fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.request(OP_DELETE, key, &[], 0)? == [1])
    }

    /// The value under `key`, or `None` when it is not set (never waits).
    ///
    /// # Errors
    /// As [`set`](Self::set).
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut reply = self.request(OP_GET, key, &[], 0)?;
        if reply.is_empty() {
            return Ok(None);
        }
        reply.remove(0);
        Ok(Some(reply))
    }

    /// The value under `key`, waiting up to `timeout` for it to be set (PyTorch's `get`).
    ///
    /// # Errors
    /// [`DistError::KeyTimeout`] when it is not set within `timeout`; as [`set`](Self::set).
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let start = Instant::now();
        loop {
            if let Some(v) = self.try_get(key)? {
                return Ok(v);
            }
            if start.elapsed() >= timeout {
                return Err(DistError::KeyTimeout {
                    key: key.to_string(),
                    timeout,
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Adds `delta` to the counter under `key` (0 when absent) and returns the new value
    /// (PyTorch's `add`).
    ///
    /// # Errors
    /// As [`set`](Self::set).
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let reply = self.request(OP_ADD, key, &delta.to_le_bytes(), 8)?;
        let bytes = <[u8; 8]>::try_from(reply.as_slice()).map_err(|_| DistError::Protocol {
            addr: self.addr.clone(),
            what: "an add reply is 8 bytes".into(),
        })?;
        Ok(i64::from_le_bytes(bytes))
    }

    /// Stores `value` under `key` unless the key is set, and returns the value now stored
    /// (`value` when this call set it): PyTorch's `compare_set(key, "", value)`.
    ///
    /// # Errors
    /// As [`set`](Self::set).
    pub fn set_if_absent(&self, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        let mut body = Vec::with_capacity(value.len() + 4);
        put_field(&mut body, value);
        self.request(OP_SET_IF_ABSENT, key, &body, 0)
    }
}

/// A TCP port of 127.0.0.1 that was free a moment ago (bound to port 0, then released): the
/// `MASTER_PORT` for a local job, as torchrun's `--standalone` picks one.
///
/// # Errors
/// [`DistError::Listen`] when no port can be bound.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| DistError::Listen {
        addr: "127.0.0.1:0".into(),
        source,
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|source| DistError::Listen {
            addr: "127.0.0.1:0".into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_add_and_set_if_absent() {
        let server = StoreServer::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().to_string();
        let a = TcpStore::connect(&addr, Duration::from_secs(5)).unwrap();
        let b = TcpStore::connect(&addr, Duration::from_secs(5)).unwrap();
        assert_eq!(a.try_get("id").unwrap(), None);
        a.set("id", &[7, 8, 9]).unwrap();
        assert_eq!(b.get("id", Duration::from_secs(1)).unwrap(), [7, 8, 9]);
        assert_eq!(a.add("n", 1).unwrap(), 1);
        assert_eq!(b.add("n", 2).unwrap(), 3);
        assert_eq!(a.set_if_absent("k", b"first").unwrap(), b"first");
        assert_eq!(b.set_if_absent("k", b"second").unwrap(), b"first");
        a.set("empty", &[]).unwrap();
        assert_eq!(b.try_get("empty").unwrap(), Some(vec![]));
        assert!(b.delete_key("id").unwrap());
        assert_eq!(a.try_get("id").unwrap(), None);
        assert!(!a.delete_key("id").unwrap());
    }

    #[test]
    fn get_times_out_naming_the_key() {
        let server = StoreServer::bind("127.0.0.1:0").unwrap();
        let s =
            TcpStore::connect(&server.local_addr().to_string(), Duration::from_secs(5)).unwrap();
        let err = s.get("never", Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, DistError::KeyTimeout { ref key, .. } if key == "never"));
    }

    #[test]
    fn connect_times_out_without_a_store() {
        // Bind and drop to find a port nobody listens on.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let err = TcpStore::connect(&addr, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, DistError::ConnectTimeout { .. }), "{err}");
        assert!(err.to_string().contains(&addr), "{err}");
    }

    #[test]
    fn a_dropped_server_fails_requests_with_io() {
        let server = StoreServer::bind("127.0.0.1:0").unwrap();
        let s =
            TcpStore::connect(&server.local_addr().to_string(), Duration::from_secs(5)).unwrap();
        drop(server);
        assert!(matches!(s.try_get("x").unwrap_err(), DistError::Io { .. }));
    }
}
