//! The dead letters of a JetStream consumer: stream `{stream}_DEAD_{consumer}`, each message
//! with the original subject in `dead-letter-subject`.

use async_nats::{
    jetstream::{self, message::StreamMessage},
    HeaderMap,
};

use super::{DeadLetter, Error, Replayed, Selection, DEAD_LETTER_HEADERS};
use crate::nats::headers_of;

/// The dead letters of one consumer of one stream.
pub struct NatsDeadLetters {
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    name: String,
}

impl NatsDeadLetters {
    /// Opens the dead letters of `consumer` on `stream` (the stream the runner consumes).
    pub async fn open(url: &str, stream: &str, consumer: &str) -> Result<Self, Error> {
        let name = format!("{stream}_DEAD_{consumer}");
        let client = async_nats::connect(url)
            .await
            .map_err(|e| Error::broker("nats: cannot connect", e))?;
        let js = jetstream::new(client);
        let handle = js.get_stream(&name).await.map_err(|e| {
            Error::broker(
                format!(
                    "nats: no dead-letter stream {name} (has consumer {consumer} of stream \
                 {stream} run?)"
                ),
                e,
            )
        })?;
        Ok(Self {
            js,
            stream: handle,
            name,
        })
    }

    /// Where the dead letters are, for messages and the audit record.
    pub fn source(&self) -> String {
        format!("nats stream {}", self.name)
    }

    /// The dead letters matching `selection`, oldest first, with their stream sequences.
    async fn read(
        &self,
        selection: &Selection,
    ) -> Result<Vec<(u64, DeadLetter, StreamMessage)>, Error> {
        let state = self
            .stream
            .get_info()
            .await
            .map_err(|e| Error::broker(format!("nats: reading {}", self.name), e))?
            .state;
        let mut out = Vec::new();
        if state.messages == 0 {
            return Ok(out);
        }
        for seq in state.first_sequence..=state.last_sequence {
            if out.len() >= selection.limit {
                break;
            }
            // A sequence already replayed (deleted) is a hole: skip it.
            let Ok(message) = self.stream.get_raw_message(seq).await else {
                continue;
            };
            let letter = DeadLetter::from_headers(
                &headers_of(&message.headers),
                header(&message.headers, "dead-letter-subject").unwrap_or_default(),
                message.payload.len(),
            );
            if selection.matches(&letter) {
                out.push((seq, letter, message));
            }
        }
        Ok(out)
    }

    /// The dead letters matching `selection`, oldest first.
    pub async fn list(&self, selection: &Selection) -> Result<Vec<DeadLetter>, Error> {
        Ok(self
            .read(selection)
            .await?
            .into_iter()
            .map(|(_, letter, _)| letter)
            .collect())
    }

    /// Publishes each dead letter matching `selection` back to its original subject, then
    /// deletes it from the dead letters. Stops at the first failure.
    pub async fn replay(&self, selection: &Selection) -> Result<Replayed, Error> {
        let mut replayed = Replayed::default();
        for (seq, letter, message) in self.read(selection).await? {
            if let Err(e) = self.replay_one(seq, &letter, &message).await {
                replayed.failure = Some(e);
                break;
            }
            replayed.letters.push(letter);
        }
        Ok(replayed)
    }

    async fn replay_one(
        &self,
        seq: u64,
        letter: &DeadLetter,
        message: &StreamMessage,
    ) -> Result<(), Error> {
        if letter.origin.is_empty() {
            return Err(Error::broker_message(format!(
                "nats: dead letter {seq} of {} has no dead-letter-subject header",
                self.name
            )));
        }
        let mut headers = HeaderMap::new();
        for (name, values) in message.headers.iter() {
            if !DEAD_LETTER_HEADERS.contains(&name.as_ref()) {
                for value in values {
                    headers.append(name.clone(), value.clone());
                }
            }
        }
        let failed = |e: &dyn std::fmt::Display| {
            Error::broker(
                format!("nats: replaying dead letter {seq} to {}", letter.origin),
                e.to_string(),
            )
        };
        self.js
            .publish_with_headers(letter.origin.clone(), headers, message.payload.clone())
            .await
            .map_err(|e| failed(&e))?
            .await
            .map_err(|e| failed(&e))?;
        self.stream
            .delete_message(seq)
            .await
            .map_err(|e| failed(&e))?;
        Ok(())
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).map(|v| v.as_str().to_owned())
}
