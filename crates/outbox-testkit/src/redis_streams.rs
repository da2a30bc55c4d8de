use std::collections::BTreeMap;

use crate::Delivery;

/// The shared Redis server.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// Every entry of stream `key` (`XRANGE - +`), decoded as the relay's Redis publisher writes
/// them: the `payload` field is the body, every other field a header.
pub async fn stream_deliveries(
    connection: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Vec<Delivery> {
    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(connection)
        .await
        .expect("XRANGE");
    entries
        .into_iter()
        .map(|(_, fields)| {
            let mut headers = BTreeMap::new();
            let mut payload = Vec::new();
            for pair in fields.chunks(2) {
                let name = String::from_utf8_lossy(&pair[0]).into_owned();
                if name == "payload" {
                    payload = pair[1].clone();
                } else {
                    headers.insert(name, String::from_utf8_lossy(&pair[1]).into_owned());
                }
            }
            Delivery::from_headers(key.to_owned(), headers, payload)
        })
        .collect()
}
