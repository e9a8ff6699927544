//! Random and malformed bytes fed to the frame reader and message decoder must give
//! errors, never panics or huge allocations.

use agent_proto::{Frame, FrameError, Kind, Message, HEADER_LEN, MAX_PAYLOAD};

/// xorshift64*: deterministic, so a failure reproduces from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn decode_all(bytes: &[u8]) -> usize {
    let mut cursor = bytes;
    let mut decoded = 0;
    loop {
        match Frame::read_from(&mut cursor) {
            Ok(frame) => {
                assert!(frame.payload.len() <= MAX_PAYLOAD);
                if let Ok(msg) = Message::from_frame(frame) {
                    msg.into_frame(1).expect("what decodes encodes again");
                }
                decoded += 1;
            }
            Err(FrameError::Closed) | Err(_) => return decoded,
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let len = rng.below(96) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        decode_all(&bytes);
    }
}

#[test]
fn valid_headers_with_garbage_payloads_never_panic() {
    let mut rng = Rng(42);
    let mut decoded = 0;
    for _ in 0..20_000 {
        let kind = Kind::ALL[rng.below(Kind::ALL.len() as u64) as usize];
        let len = rng.below(64) as usize;
        let mut payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if rng.below(3) == 0 {
            // Almost-JSON: a valid object with a random field flipped.
            payload = br#"{"argv":["x"],"env":[],"workdir":null,"stdin":false,"timeout_ms":1,"max_output_bytes":2}"#.to_vec();
            let at = rng.below(payload.len() as u64) as usize;
            payload[at] = rng.next() as u8;
        }
        let flags = rng.next() as u8;
        let frame = Frame::new(rng.next() as u32, kind, payload).with_flags(flags);
        let bytes = frame.to_bytes().expect("fits");
        decoded += decode_all(&bytes);
    }
    assert_eq!(decoded, 20_000, "well-framed input always yields a frame");
}

#[test]
fn mutated_valid_streams_never_panic() {
    let base = {
        let mut v = Vec::new();
        for msg in [
            Message::Hello(agent_proto::Hello::new("x")),
            Message::Stdout(b"abc".to_vec()),
            Message::ExecKill,
        ] {
            v.extend(
                msg.into_frame(3)
                    .expect("encodes")
                    .to_bytes()
                    .expect("fits"),
            );
        }
        v
    };
    let mut rng = Rng(7);
    for _ in 0..20_000 {
        let mut bytes = base.clone();
        for _ in 0..=rng.below(4) {
            let at = rng.below(bytes.len() as u64) as usize;
            bytes[at] = rng.next() as u8;
        }
        let cut = rng.below(bytes.len() as u64 + 1) as usize;
        decode_all(&bytes[..cut]);
    }
    assert!(base.len() > 3 * HEADER_LEN);
}
