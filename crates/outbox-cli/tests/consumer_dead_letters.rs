//! `outbox consumer-dead-letters list | replay` against real NATS and PostgreSQL: dead letters
//! written as the NATS runner writes them (stream `{stream}_DEAD_{consumer}`, the original
//! subject and the reason in headers), replayed to the original subject and audited.

mod support;

use async_nats::{jetstream, HeaderMap};
use outbox_testkit::{database_url, unique, TestDb, NATS_URL};
use support::run;

struct Streams {
    js: jetstream::Context,
    stream: String,
    prefix: String,
}

impl Streams {
    /// The consumer's stream and its dead letters: one poison event, one malformed message.
    async fn new() -> Self {
        let js = jetstream::new(async_nats::connect(NATS_URL).await.unwrap());
        let stream = unique("CDL");
        let prefix = unique("cdl");
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
        let dead_subject = format!("dead.{stream}.inventory");
        js.create_stream(jetstream::stream::Config {
            name: format!("{stream}_DEAD_inventory"),
            subjects: vec![dead_subject.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
        for (event_id, reason) in [
            (
                Some("0190a0b0-0000-7000-8000-000000000001"),
                "cannot reserve: poison",
            ),
            (None, "malformed message: no event-id header"),
        ] {
            let mut headers = HeaderMap::new();
            if let Some(id) = event_id {
                headers.insert("event-id", id);
                headers.insert("event-type", "OrderPlaced");
            }
            headers.insert("dead-letter-reason", reason);
            headers.insert("dead-letter-attempts", "5");
            headers.insert(
                "dead-letter-subject",
                format!("{prefix}.order.OrderPlaced").as_str(),
            );
            headers.insert("dead-letter-consumer", "inventory");
            js.publish_with_headers(dead_subject.clone(), headers, "{\"qty\":1}".into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        Self { js, stream, prefix }
    }

    fn args<'a>(&'a self, action: &'a str) -> Vec<&'a str> {
        vec![
            "consumer-dead-letters",
            action,
            "--broker-url",
            NATS_URL,
            "--stream",
            &self.stream,
            "--consumer",
            "inventory",
        ]
    }

    async fn cleanup(self) {
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self
            .js
            .delete_stream(format!("{}_DEAD_inventory", self.stream))
            .await;
    }
}

fn text(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn lists_then_replays_a_dead_letter_to_its_subject_and_audits_it() {
    let db = TestDb::new(1).await;
    let s = Streams::new().await;
    let o = run(&[s.args("list"), vec!["--json"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[0]["reason"], "cannot reserve: poison");
    assert_eq!(listed[1]["event_id"], serde_json::Value::Null);

    let o = run(&s.args("replay"));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o)
            .1
            .contains("replay needs --event-id, --reason-contains, or --all"),
        "{:?}",
        text(&o)
    );

    let url = database_url();
    let replay = [
        s.args("replay"),
        vec![
            "--reason-contains",
            "POISON",
            "--database-url",
            &url,
            "--schema",
            &db.schema,
            "--actor",
            "ops",
            "--reason",
            "fix deployed",
        ],
    ]
    .concat();
    let o = run(&[replay.clone(), vec!["--dry-run"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("would replay 1 dead letter(s):"), "{out}");

    let o = run(&replay);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.starts_with("replayed 1 dead letter(s) of inventory"),
        "{out}"
    );
    // Back on the original subject, without the dead-letter headers.
    let stream = s.js.get_stream(&s.stream).await.unwrap();
    let message = stream.get_raw_message(1).await.unwrap();
    assert_eq!(
        message.subject.as_str(),
        format!("{}.order.OrderPlaced", s.prefix)
    );
    assert_eq!(
        message.headers.get("event-id").unwrap().as_str(),
        "0190a0b0-0000-7000-8000-000000000001"
    );
    assert!(message.headers.get("dead-letter-reason").is_none());
    // Gone from the dead letters; the malformed one stays.
    let o = run(&[s.args("list"), vec!["--json"]].concat());
    let left: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(left.as_array().unwrap().len(), 1);
    let (actor, reason, details): (String, String, serde_json::Value) =
        sqlx::query_as(&db.tables.render(
            "SELECT actor, reason, details FROM {schema}.audit WHERE action = 'consumer_replay'",
        ))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((actor.as_str(), reason.as_str()), ("ops", "fix deployed"));
    assert_eq!(
        details["event_ids"][0],
        "0190a0b0-0000-7000-8000-000000000001"
    );
    assert_eq!(details["consumer"], "inventory");
    s.cleanup().await;
}

#[tokio::test]
async fn names_what_is_missing_or_wrong() {
    let o = run(&[
        "consumer-dead-letters",
        "list",
        "--broker-url",
        NATS_URL,
        "--stream",
        "NO_SUCH_STREAM",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("--consumer is required with nats://"),
        "{:?}",
        text(&o)
    );
    let o = run(&[
        "consumer-dead-letters",
        "list",
        "--broker-url",
        NATS_URL,
        "--stream",
        "NO_SUCH_STREAM",
        "--consumer",
        "inventory",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o)
            .1
            .contains("no dead-letter stream NO_SUCH_STREAM_DEAD_inventory"),
        "{:?}",
        text(&o)
    );
    let o = run(&[
        "consumer-dead-letters",
        "list",
        "--broker-url",
        "redis://user:secret@127.0.0.1:6379",
    ]);
    let (_, err) = text(&o);
    assert!(
        err.contains("--broker-url must be nats://…, amqp://… or kafka://…"),
        "{err}"
    );
    assert!(!err.contains("secret"), "{err}");
    let o = run(&[
        "consumer-dead-letters",
        "list",
        "--broker-url",
        "kafka://user:secret@127.0.0.1:9092",
        "--consumer",
        "inventory",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("kafka:// takes host:port[,host:port…]"),
        "{err}"
    );
    assert!(!err.contains("secret"), "{err}");
}
