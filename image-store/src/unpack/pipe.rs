//! Decompression and diff_id hashing on their own thread, feeding the tar reader through a
//! bounded channel: inflating (CPU) then overlaps with creating files (mostly kernel time),
//! which makes a cold unpack markedly faster on a multi-core host.

use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::decompress::{self, Compression};
use crate::digest::{Digest, Hasher};

const CHUNK: usize = 256 * 1024;
/// Chunks in flight: bounds memory to a few MiB whatever the layer size.
const DEPTH: usize = 8;

/// What the producer thread found once it read its input to the end.
pub struct Produced {
    pub compression: Compression,
    pub digest: Digest,
    pub bytes: u64,
}

/// The consumer side: a `Read` over the decompressed stream.
pub struct Pipe {
    rx: Receiver<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
    stop: Arc<AtomicBool>,
    producer: Option<JoinHandle<io::Result<Produced>>>,
}

impl Pipe {
    /// Starts the producer; it gives up with an [`is_over_limit`] error once the stream
    /// passes `max_bytes` uncompressed bytes.
    pub fn start<R: Read + Send + 'static>(
        input: BufReader<R>,
        max_bytes: u64,
    ) -> io::Result<Pipe> {
        let (tx, rx) = sync_channel::<Vec<u8>>(DEPTH);
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let producer = std::thread::Builder::new()
            .name("layer-inflate".into())
            .spawn(move || {
                let (compression, mut reader) = decompress::open(input)?;
                let mut hasher = Hasher::default();
                // Keeps hashing after the consumer stopped listening (the tar end marker can
                // come before the end of the stream, and the diff_id covers every byte).
                let mut listening = true;
                loop {
                    if halt.load(Ordering::Relaxed) {
                        return Err(io::Error::other("unpack abandoned"));
                    }
                    let mut buf = vec![0u8; CHUNK];
                    let n = fill(&mut reader, &mut buf)?;
                    if n == 0 {
                        break;
                    }
                    buf.truncate(n);
                    hasher.update(&buf);
                    if hasher.bytes() > max_bytes {
                        return Err(io::Error::other(OverLimit));
                    }
                    if listening && tx.send(buf).is_err() {
                        listening = false;
                    }
                }
                let bytes = hasher.bytes();
                Ok(Produced {
                    compression,
                    digest: hasher.finish(),
                    bytes,
                })
            })?;
        Ok(Pipe {
            rx,
            current: Vec::new(),
            pos: 0,
            stop,
            producer: Some(producer),
        })
    }

    /// Stops listening and waits for the producer's verdict on the whole stream.
    pub fn finish(mut self) -> io::Result<Produced> {
        self.join()
    }

    /// Tells the producer to give up (the consumer failed) and returns its verdict: an
    /// [`is_over_limit`] error when it cut the stream itself.
    pub fn abandon(mut self) -> io::Result<Produced> {
        self.stop.store(true, Ordering::Relaxed);
        self.join()
    }

    fn join(&mut self) -> io::Result<Produced> {
        // Dropping the receiver unblocks a producer waiting on a full channel.
        let (_, dead) = sync_channel(0);
        drop(std::mem::replace(&mut self.rx, dead));
        match self.producer.take() {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("inflate thread panicked"))),
            None => Err(io::Error::other("pipe already finished")),
        }
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        if self.producer.is_some() {
            self.stop.store(true, Ordering::Relaxed);
            let _ = self.join();
        }
    }
}

impl Read for Pipe {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.current.len() {
            match self.rx.recv() {
                Ok(buf) => {
                    self.current = buf;
                    self.pos = 0;
                }
                // Producer done (or failed: `finish` reports why).
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len() - self.pos);
        out[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The producer's reason for stopping at the byte limit.
#[derive(Debug)]
struct OverLimit;

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("layer expands past the image's byte limit")
    }
}

impl std::error::Error for OverLimit {}

/// Whether the producer stopped because the stream passed its byte limit.
pub fn is_over_limit(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<OverLimit>())
}

/// Reads until `buf` is full or the input ends.
fn fill(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
