//! Measures what the lock server's table and a gateway's token table cost per held segment:
//! a million exclusive tokens granted (`cargo run --release -p stics-coherence --example
//! table_size`), each table's growth in resident memory divided by the tokens. Seed 004's table
//! is 9 bytes per segment, for every segment of the LUN.

use std::time::{Duration, Instant};

use stics_coherence::{Client, Kind, Msg, Policy, Server};

/// Resident bytes of this process (Linux).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn main() {
    let n: u64 = 1 << 20;
    let t = Instant::now();
    let before = resident();
    let mut server = Server::new(Policy::default());
    for batch in 0..n / 1024 {
        let ops = batch * 1024..(batch + 1) * 1024;
        let asks: Vec<Msg> = ops.clone().map(|i| Msg::Request { op: i, seg: i, kind: Kind::Exclusive }).collect();
        server.handle(1, &asks, t);
        server.handle(1, &ops.map(|op| Msg::Done { op }).collect::<Vec<_>>(), t);
    }
    server.take_changes();
    let grown = resident().saturating_sub(before);
    println!("lock server: {} segments held, {:.0} bytes each", server.len(), grown as f64 / n as f64);
    let before = resident();
    let mut client = Client::new(Duration::from_secs(30));
    client.heard(t, t);
    for seg in 0..n {
        let (op, _) = client.begin(&[(seg, Kind::Exclusive)], t);
        client.on_msg(Msg::Grant { op, seg, kind: Kind::Exclusive, gen: seg + 1, ticket: seg + 1 }, t);
        client.end(op);
    }
    let grown = resident().saturating_sub(before);
    println!("gateway: {} tokens held, {:.0} bytes each", client.counts().1, grown as f64 / n as f64);
}
