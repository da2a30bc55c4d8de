//! A broker failure keeps the client's error as its source: the message says what was being
//! done, the chain says why, and neither repeats the other.

use outbox_consumer::dead_letters::{nats::NatsDeadLetters, rabbitmq::RabbitMqDeadLetters, Error};

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// The error and its causes, outermost first.
fn chain(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut texts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        texts.push(cause.to_string());
        source = cause.source();
    }
    texts
}

/// Checks that `error` is a broker failure saying `context`, caused by another error whose
/// text the context does not repeat.
fn assert_caused(error: Error, context: &str) {
    let Error::Broker { source, .. } = &error else {
        panic!("not a broker failure: {error:?}");
    };
    assert!(source.is_some(), "the cause is kept: {error:?}");
    let texts = chain(&error);
    assert_eq!(texts[0], context, "{texts:?}");
    assert!(texts.len() >= 2, "{texts:?}");
    assert!(
        !texts[0].contains(&texts[1]),
        "the message does not repeat its cause: {texts:?}"
    );
}

#[tokio::test]
async fn a_nats_connection_refused_keeps_its_cause() {
    let url = format!("nats://127.0.0.1:{}", closed_port());
    let error = NatsDeadLetters::open(&url, "S", "c")
        .await
        .err()
        .expect("refused");
    assert_caused(error, "nats: cannot connect");
}

#[tokio::test]
async fn a_rabbitmq_connection_refused_keeps_its_cause() {
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", closed_port());
    let error = RabbitMqDeadLetters::open(&url, "q")
        .await
        .err()
        .expect("refused");
    assert_caused(error, "rabbitmq: cannot connect");
}
