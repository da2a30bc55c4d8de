//! The broker of a run: a private nats-server (restarted by the chaos loop) or the shared
//! RabbitMQ (never restarted: it is shared; the run uses an exchange and queues of its own).

use lapin::{
    options::{QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions},
    types::FieldTable,
    Channel, Connection, ConnectionProperties,
};
use outbox_testkit::{unique, NatsServer, RabbitReader, RABBITMQ_URL};

use super::consumer::Recorder;

/// Which broker the relays publish to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerKind {
    /// A private NATS JetStream server, crashed and restarted during the run.
    Nats,
    /// The shared RabbitMQ on 5672 (not restarted).
    RabbitMq,
}

/// The running broker and the independent consumer reading it.
pub struct Broker {
    /// Its URL, for the relays.
    pub url: String,
    /// The consumer.
    pub recorder: Recorder,
    /// NATS: the private server.
    nats: Option<NatsServer>,
    /// NATS: the stream.
    stream: String,
    /// RabbitMQ: the exchange and the consumer's queue (declared by the testkit), and a
    /// second queue bound the same way for `outbox verify`.
    rabbit: Option<(RabbitReader, String, Channel, Connection)>,
}

impl Broker {
    /// Starts the broker (NATS) or declares the run's exchange and queues (RabbitMQ), and the
    /// consumer. Subjects and routing keys start with `prefix`.
    pub async fn start(kind: BrokerKind, prefix: &str) -> Self {
        match kind {
            BrokerKind::Nats => {
                let nats = NatsServer::start().await;
                let stream = unique("CHAOS");
                let recorder = Recorder::nats(&nats.url(), &stream, prefix).await;
                Self {
                    url: nats.url(),
                    recorder,
                    nats: Some(nats),
                    stream,
                    rabbit: None,
                }
            }
            BrokerKind::RabbitMq => {
                let exchange = unique("chaos");
                let reader = RabbitReader::declare_only(&exchange, "#").await;
                let connection = Connection::connect(RABBITMQ_URL, ConnectionProperties::default())
                    .await
                    .expect("connect to RabbitMQ");
                let channel = connection.create_channel().await.expect("channel");
                let audit = format!("{exchange}.audit");
                channel
                    .queue_declare(
                        &audit,
                        QueueDeclareOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .expect("declare the audit queue");
                channel
                    .queue_bind(
                        &audit,
                        &exchange,
                        "#",
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .expect("bind the audit queue");
                let recorder = Recorder::rabbitmq(RABBITMQ_URL, &reader.queue).await;
                Self {
                    url: RABBITMQ_URL.into(),
                    recorder,
                    nats: None,
                    stream: String::new(),
                    rabbit: Some((reader, audit, channel, connection)),
                }
            }
        }
    }

    /// The broker's section of the relay config.
    pub fn relay_config(&self) -> String {
        match &self.rabbit {
            None => format!(
                "[nats]\nstream = \"{}\"\nack_timeout = \"2s\"\n",
                self.stream
            ),
            Some((reader, ..)) => format!("[rabbitmq]\nexchange = \"{}\"\n", reader.exchange),
        }
    }

    /// What `outbox verify` needs besides the URLs.
    pub fn verify_args(&self) -> Vec<String> {
        match &self.rabbit {
            None => vec!["--stream".into(), self.stream.clone()],
            Some((_, audit, ..)) => vec!["--queue".into(), audit.clone()],
        }
    }

    /// The server the chaos loop may restart (NATS only).
    pub fn restartable(&mut self) -> Option<&mut NatsServer> {
        self.nats.as_mut()
    }

    /// Where the relay's messages go, for the log.
    pub fn describe(&self) -> String {
        match &self.rabbit {
            None => format!(
                "private nats-server at {}, stream {}",
                self.url, self.stream
            ),
            Some((reader, ..)) => format!(
                "shared RabbitMQ, exchange {}, queue {}",
                reader.exchange, reader.queue
            ),
        }
    }

    /// Stops the consumer; deletes the RabbitMQ queues and exchange (the private NATS server
    /// and its store go when dropped).
    pub async fn stop(self) -> Vec<super::consumer::Record> {
        let records = self.recorder.records();
        self.recorder.stop().await;
        if let Some((reader, audit, channel, _connection)) = self.rabbit {
            let _ = channel
                .queue_delete(&audit, QueueDeleteOptions::default())
                .await;
            reader.cleanup().await;
        }
        records
    }
}
