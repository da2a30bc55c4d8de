//! The claim plan driven claim by claim, without a database: what is claimed, from where,
//! how much, and when the loop claims again.

use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::{adapt, ClaimPlan};
use crate::{complete::Tally, config::RelayConfig, store::ClaimedRow};

fn config() -> RelayConfig {
    RelayConfig {
        min_batch_size: 4,
        max_batch_size: 16,
        max_inflight_batches: 2,
        claim_linger: Duration::from_millis(5),
        poll_interval: Duration::from_millis(100),
        rescan_interval: Duration::from_secs(30),
        max_inflight_bytes: 1_000,
        ..RelayConfig::default()
    }
}

/// A pending row of `partition` with id `id`, holding `bytes`.
fn row(partition: i32, id: i64, bytes: i64) -> ClaimedRow {
    ClaimedRow {
        id,
        event_id: Uuid::now_v7(),
        aggregate_type: "order".into(),
        aggregate_id: id.to_string(),
        aggregate_version: None,
        event_type: "Placed".into(),
        schema_version: 1,
        destination: None,
        payload: None,
        payload_size: 0,
        content_type: "application/json".into(),
        headers: "{}".into(),
        unreadable: None,
        occurred_at: None,
        partition,
        attempts: 0,
        permanent_failures: 0,
        row_bytes: bytes,
    }
}

fn rows(partition: i32, ids: std::ops::Range<i64>) -> Vec<ClaimedRow> {
    ids.map(|id| row(partition, id, 1)).collect()
}

const PARTITIONS: [(i32, i64); 3] = [(0, 7), (1, 7), (2, 7)];

fn tally(published: usize, transient: usize) -> Tally {
    Tally {
        published,
        dead: 0,
        transient,
    }
}

#[test]
fn batch_size_adapts_to_the_backlog() {
    let c = RelayConfig::default();
    assert_eq!(adapt(50, 50, &c), 100);
    assert_eq!(adapt(800, 800, &c), 1000);
    assert_eq!(adapt(1000, 100, &c), 500);
    assert_eq!(adapt(100, 60, &c), 100);
    assert_eq!(adapt(50, 0, &c), 50);
}

#[test]
fn a_full_claim_is_followed_at_once_and_a_partial_one_only_after_the_linger() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    assert!(plan.ready(t0, 0));
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    assert_eq!(claim.batch_size, 4);
    plan.claimed(claim, &rows(0, 1..5), false, t0).unwrap();
    assert!(plan.ready(t0, 1), "full: the next claim at once");
    plan.batch_done(&[0], 4, &tally(4, 0), t0);

    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    assert_eq!(claim.batch_size, 8, "full claims double the batch");
    plan.claimed(claim, &rows(1, 10..12), false, t0).unwrap();
    assert!(!plan.ready(t0, 1), "partial: more is not pending");
    plan.wake();
    assert!(!plan.ready(t0 + Duration::from_millis(4), 1), "lingering");
    assert!(plan.ready(t0 + Duration::from_millis(5), 1));
    assert_eq!(
        plan.wait(t0 + Duration::from_millis(2), 1),
        Duration::from_millis(3),
        "the wait is the rest of the linger"
    );
}

#[test]
fn a_partition_with_a_batch_in_flight_is_not_claimed_until_the_batch_is_done() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    let batch = plan.claimed(claim, &rows(1, 1..5), false, t0).unwrap();
    assert_eq!(
        batch.fences,
        [(1, 7)],
        "the batch fences its partition only"
    );
    assert_eq!(batch.bytes, 4);
    for _ in 0..3 {
        let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
        let offered: Vec<i32> = claim.partitions.iter().map(|p| p.0).collect();
        assert!(!offered.contains(&1), "{offered:?}");
        assert_eq!(offered.len(), 2);
        plan.claimed(claim, &[], false, t0);
    }
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    plan.claimed(claim, &[row(0, 9, 1), row(2, 9, 1)], false, t0);
    assert!(plan.next_claim(PARTITIONS.to_vec(), t0).is_none());
    plan.wake();
    assert!(plan.ready(t0 + Duration::from_secs(1), 0));
    assert!(
        plan.next_claim(PARTITIONS.to_vec(), t0).is_none(),
        "every partition busy: nothing to claim"
    );
    assert!(
        !plan.ready(t0 + Duration::from_secs(1), 0),
        "until a batch is done"
    );
    assert_eq!(plan.batch_done(&[1], 4, &tally(4, 0), t0), None);
    assert!(plan.ready(t0 + Duration::from_secs(1), 0));
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    assert_eq!(claim.partitions, [(1, 0)]);
}

#[test]
fn each_partition_leads_a_claim_in_turn() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    let mut leaders = Vec::new();
    for _ in 0..3 {
        let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
        leaders.push(claim.partitions[0].0);
        plan.claimed(claim, &[], false, t0);
    }
    leaders.sort();
    assert_eq!(leaders, [0, 1, 2]);
}

#[test]
fn scan_floors_follow_full_claims_and_are_cleared_when_claims_keep_up() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    let floor = |plan: &mut ClaimPlan, at: Instant| {
        let claim = plan.next_claim(vec![(0, 1)], at).unwrap();
        let floor = claim.partitions[0].1;
        (claim, floor)
    };
    let (claim, start) = floor(&mut plan, t0);
    assert_eq!(start, 0);
    let batch = plan.claimed(claim, &rows(0, 40..44), false, t0).unwrap();
    plan.batch_done(&[0], batch.bytes, &tally(4, 0), t0);
    let (claim, start) = floor(&mut plan, t0);
    assert_eq!(start, 40, "a full claim: the next scans from its lowest id");
    let batch = plan.claimed(claim, &rows(0, 44..52), false, t0).unwrap();
    plan.batch_done(&[0], batch.bytes, &tally(8, 0), t0);
    let (claim, start) = floor(&mut plan, t0);
    assert_eq!(start, 44);
    let batch = plan.claimed(claim, &rows(0, 60..62), false, t0).unwrap();
    plan.batch_done(&[0], batch.bytes, &tally(2, 0), t0);
    let (claim, start) = floor(&mut plan, t0);
    assert_eq!(start, 0, "keeping up: the next claim scans from the start");

    let batch = plan.claimed(claim, &rows(0, 70..86), false, t0).unwrap();
    plan.batch_done(&[0], batch.bytes, &tally(16, 0), t0);
    let (_, start) = floor(&mut plan, t0 + Duration::from_secs(29));
    assert_eq!(start, 70);
    let (_, start) = floor(&mut plan, t0 + Duration::from_secs(30));
    assert_eq!(start, 0, "every rescan interval, a full scan");
}

#[test]
fn empty_claims_double_the_idle_wait_up_to_the_poll_interval() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    let batch = plan.claimed(claim, &rows(0, 1..2), false, t0).unwrap();
    plan.batch_done(&[0], batch.bytes, &tally(1, 0), t0);
    let mut waits = Vec::new();
    for _ in 0..6 {
        let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
        plan.claimed(claim, &[], false, t0);
        waits.push(plan.wait(t0, 0).as_millis());
    }
    assert_eq!(waits, [10, 20, 40, 80, 100, 100]);
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    plan.claimed(claim, &rows(0, 2..3), false, t0);
    assert_eq!(
        plan.wait(t0, 1),
        Duration::from_millis(5),
        "events: eager again"
    );
}

#[test]
fn the_byte_budget_stops_claims_until_a_batch_gives_its_bytes_back() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    assert_eq!(claim.byte_room, 1_000);
    let first = plan.claimed(claim, &[row(0, 1, 700)], true, t0).unwrap();
    assert!(plan.ready(t0, 1), "cut by the budget: more is waiting");
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    assert_eq!(claim.byte_room, 300);
    assert_eq!(
        claim.batch_size, 4,
        "a cut claim does not adapt the batch size"
    );
    plan.claimed(claim, &[row(1, 2, 400)], true, t0).unwrap();
    assert_eq!(plan.inflight_bytes(), 1_100);
    assert!(!plan.ready(t0, 0), "over the budget");
    assert_eq!(
        plan.wait(t0, 0),
        Duration::from_millis(100),
        "a fallback only"
    );
    plan.batch_done(&[0], first.bytes, &tally(1, 0), t0);
    assert_eq!(plan.inflight_bytes(), 400);
    assert!(plan.ready(t0, 1));
}

#[test]
fn a_batch_that_only_failed_transiently_pauses_the_claims_and_a_publish_resets_the_pause() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    plan.claimed(claim, &rows(0, 1..5), false, t0).unwrap();
    let first = plan.batch_done(&[0], 4, &tally(0, 4), t0).unwrap();
    assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
    assert!(!plan.ready(t0, 0));
    assert!(plan.ready(t0 + first, 0));
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0 + first).unwrap();
    plan.claimed(claim, &rows(0, 1..9), false, t0 + first)
        .unwrap();
    let second = plan.batch_done(&[0], 8, &tally(0, 8), t0 + first).unwrap();
    assert!(
        second >= Duration::from_millis(100),
        "the pause grows: {second:?}"
    );
    assert_eq!(
        plan.batch_done(&[], 0, &tally(1, 3), t0),
        None,
        "a batch that published something is no broker outage"
    );
    let third = plan.batch_done(&[], 0, &tally(0, 1), t0).unwrap();
    assert!(
        third <= Duration::from_millis(100),
        "reset by the publish: {third:?}"
    );
}

#[test]
fn a_failed_claim_pauses_the_claims_for_a_growing_delay() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    let first = plan.claim_failed(t0);
    assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
    assert!(!plan.ready(t0, 0));
    assert_eq!(plan.wait(t0, 0), first);
    assert!(plan.ready(t0 + first, 0));
    let second = plan.claim_failed(t0);
    assert!(second >= Duration::from_millis(100), "{second:?}");
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0 + second).unwrap();
    plan.claimed(claim, &[], false, t0 + second);
    let again = plan.claim_failed(t0);
    assert!(
        again <= Duration::from_millis(100),
        "a claim that worked resets it"
    );
}

#[test]
fn every_batch_slot_taken_stops_claims_until_one_is_done() {
    let t0 = Instant::now();
    let mut plan = ClaimPlan::new(&config(), t0);
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    plan.claimed(claim, &rows(0, 1..5), false, t0).unwrap();
    let claim = plan.next_claim(PARTITIONS.to_vec(), t0).unwrap();
    plan.claimed(claim, &rows(1, 5..13), false, t0).unwrap();
    assert!(!plan.ready(t0, 2), "two batches in flight, two slots");
    assert_eq!(
        plan.wait(t0, 2),
        Duration::from_millis(100),
        "a fallback only"
    );
    plan.batch_done(&[0], 4, &tally(4, 0), t0);
    assert!(plan.ready(t0, 1));
}
