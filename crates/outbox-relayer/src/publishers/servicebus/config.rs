use std::{fmt, time::Duration};

use serde::{Deserialize, Serialize};

/// The placeholder an address template replaces with the message's destination.
pub const DESTINATION: &str = "{destination}";

/// Default address template for Azure Service Bus: the destination is the entity (queue or
/// topic) name.
pub const SERVICE_BUS_ADDRESS: &str = "{destination}";

/// Default address template for a generic AMQP 1.0 broker: RabbitMQ's AMQP 1.0 plugin reads
/// `/exchange/X/K` as "exchange `X`, routing key `K`".
pub const GENERIC_ADDRESS: &str = "/exchange/outbox/{destination}";

/// AMQP 1.0 / Azure Service Bus settings (`[servicebus]` in the config file).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceBusConfig {
    /// Where to connect, and as whom; usually given as `--broker-url`. Never logged (it holds
    /// the key). One of:
    /// * an Azure connection string,
    ///   `Endpoint=sb://NAMESPACE.servicebus.windows.net/;SharedAccessKeyName=NAME;SharedAccessKey=KEY`
    ///   (`EntityPath=` is accepted: it becomes the default address; `UseDevelopmentEmulator=true`
    ///   connects without TLS on port 5672, for the Service Bus emulator);
    /// * `sb://NAME:KEY@NAMESPACE.servicebus.windows.net` (key name and percent-encoded key);
    /// * `amqp1://user:pass@host:5672` for a generic AMQP 1.0 broker (no TLS; SASL ANONYMOUS
    ///   without user), or `amqps1://user:pass@host:5671` for the same over TLS.
    ///
    /// Service Bus always uses TLS on port 5671 (rustls, Mozilla's root certificates) and SASL
    /// PLAIN with the key name and key. Default `amqp1://guest:guest@127.0.0.1:5672`.
    pub connection_string: String,
    /// Target address of each message; `{destination}` is replaced with the event's destination.
    /// Default: `{destination}` (the queue or topic name) for Service Bus, the connection
    /// string's `EntityPath` when it has one, and `/exchange/outbox/{destination}` for a generic
    /// broker (RabbitMQ's AMQP 1.0 plugin: exchange `outbox`, routing key = destination).
    pub address: Option<String>,
    /// Wait for the broker's disposition at most this long (default 10s); then the attempt is
    /// transient (the message may have been delivered; the retry is a duplicate that Service
    /// Bus duplicate detection drops, since the message id is the event id).
    #[serde(with = "humantime_serde")]
    pub ack_timeout: Duration,
    /// Give up connecting (TCP, TLS, SASL, open, begin, attach) after this long; the publish
    /// fails as transient and the next one tries again (default 5s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Largest payload accepted (default 256 KiB, the Service Bus Standard tier's message
    /// limit). Premium entities accept up to 100 MiB when their `maxMessageSizeInKilobytes`
    /// is raised (1 MiB by default); raise this to match. Service Bus counts headers and
    /// properties too, so a payload just under the limit can still be refused by the broker
    /// (as permanent).
    pub max_payload_bytes: usize,
    /// Destination prefixes an event may be sent to (default none: any entity the other rules
    /// allow). A prefix matches as written (`orders-` allows `orders-placed`). On a generic
    /// broker with an address template such as `/exchange/{destination}`, where the
    /// destination picks the exchange, set it to the exchanges events may reach (`ev/`).
    pub entity_prefixes: Vec<String>,
}

impl Default for ServiceBusConfig {
    fn default() -> Self {
        Self {
            connection_string: "amqp1://guest:guest@127.0.0.1:5672".into(),
            address: None,
            ack_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            max_payload_bytes: 256 * 1024,
            entity_prefixes: Vec::new(),
        }
    }
}

impl fmt::Debug for ServiceBusConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceBusConfig")
            .field("connection_string", &self.redacted())
            .field("address", &self.address)
            .field("ack_timeout", &self.ack_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .finish()
    }
}

impl ServiceBusConfig {
    /// Checks the values without any I/O; the error names the field and never repeats the
    /// connection string.
    pub fn validate(&self) -> Result<(), String> {
        let endpoint = self.endpoint()?;
        let address = self.address_template(&endpoint);
        if address.is_empty() || address.chars().any(char::is_control) {
            return Err(
                "servicebus.address: must be non-empty printable text (use {destination} for \
                 the event's destination)"
                    .into(),
            );
        }
        if self.ack_timeout.is_zero() {
            return Err("servicebus.ack_timeout: must be more than 0".into());
        }
        if self.connect_timeout.is_zero() {
            return Err("servicebus.connect_timeout: must be more than 0".into());
        }
        if self.max_payload_bytes == 0 {
            return Err("servicebus.max_payload_bytes: must be more than 0".into());
        }
        if let Some(bad) = self
            .entity_prefixes
            .iter()
            .find(|p| p.is_empty() || p.starts_with('$'))
        {
            return Err(format!(
                "servicebus.entity_prefixes: {bad:?} must be non-empty and not a '$' system node"
            ));
        }
        Ok(())
    }

    /// Where the connection string points, without its secret (`sb://ns.servicebus.windows.net:5671`).
    pub fn redacted(&self) -> String {
        match self.endpoint() {
            Ok(endpoint) => endpoint.to_string(),
            Err(_) => "<invalid connection string, hidden>".into(),
        }
    }

    /// Uses a `--broker-url`: it replaces the connection string, except a bare
    /// `sb://NAMESPACE…` without a key when the configured connection string is an Azure one
    /// for that namespace (the key stays in the config file or environment, not on the
    /// command line).
    pub fn set_broker_url(&mut self, url: String) {
        let bare_namespace = url
            .strip_prefix("sb://")
            .filter(|rest| !rest.contains('@'))
            .and_then(|rest| split_host_port(rest.split('/').next()?, 5671).ok());
        if let (Some((host, _)), Ok(configured)) = (bare_namespace, self.endpoint()) {
            if configured.flavour == Flavour::ServiceBus
                && configured.credentials.is_some()
                && configured.host.eq_ignore_ascii_case(&host)
            {
                return;
            }
        }
        self.connection_string = url;
    }

    pub(crate) fn endpoint(&self) -> Result<Endpoint, String> {
        Endpoint::parse(&self.connection_string)
            .map_err(|e| format!("servicebus.connection_string: {e}"))
    }

    /// The address template in effect for `endpoint`.
    pub(crate) fn address_template(&self, endpoint: &Endpoint) -> String {
        match (&self.address, &endpoint.entity_path, endpoint.flavour) {
            (Some(address), _, _) => address.clone(),
            (None, Some(entity), _) => entity.clone(),
            (None, None, Flavour::ServiceBus) => SERVICE_BUS_ADDRESS.into(),
            (None, None, Flavour::Generic) => GENERIC_ADDRESS.into(),
        }
    }
}

/// Which kind of broker the connection string names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavour {
    /// Azure Service Bus (or its emulator).
    ServiceBus,
    /// Any AMQP 1.0 broker (RabbitMQ's plugin, ActiveMQ Artemis, Qpid…).
    Generic,
}

/// A parsed connection string. `Display` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub flavour: Flavour,
    pub host: String,
    pub port: u16,
    pub tls: bool,
    /// SASL PLAIN user and password (Service Bus: key name and key); none = ANONYMOUS.
    pub credentials: Option<(String, String)>,
    /// `EntityPath` of an Azure connection string.
    pub entity_path: Option<String>,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match (self.flavour, self.tls) {
            (Flavour::ServiceBus, _) => "sb",
            (Flavour::Generic, false) => "amqp1",
            (Flavour::Generic, true) => "amqps1",
        };
        let user = match &self.credentials {
            Some((user, _)) => format!("{user}:***@"),
            None => String::new(),
        };
        write!(f, "{scheme}://{user}{}:{}", self.host, self.port)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Endpoint {
    /// Parses any accepted form. Errors describe the problem without quoting the input.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("is empty".into());
        }
        let url = text
            .split_once("://")
            .filter(|(scheme, _)| scheme.chars().all(|c| c.is_ascii_alphanumeric()));
        let Some((scheme, rest)) = url else {
            if text.contains('=') {
                return Self::parse_azure(text);
            }
            return Err("must be an Azure connection string (Endpoint=sb://…;\
                        SharedAccessKeyName=…;SharedAccessKey=…), sb://, amqp1:// or amqps1://"
                .into());
        };
        let (flavour, tls, port) = match scheme.to_ascii_lowercase().as_str() {
            "sb" => (Flavour::ServiceBus, true, 5671),
            "amqp1" => (Flavour::Generic, false, 5672),
            "amqps1" => (Flavour::Generic, true, 5671),
            other => {
                return Err(format!(
                    "scheme {other:?} is not one of sb://, amqp1://, amqps1:// (or an Azure \
                     connection string)"
                ))
            }
        };
        let (authority, path) = match rest.split_once('/') {
            Some((authority, path)) => (authority, path),
            None => (rest, ""),
        };
        if !path.is_empty() {
            return Err(
                "must not have a path (put the entity in servicebus.address or the destination)"
                    .into(),
            );
        }
        let (credentials, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                let user = decode(user).map_err(|e| format!("user name: {e}"))?;
                let password = decode(password).map_err(|e| format!("password: {e}"))?;
                if user.is_empty() {
                    return Err("has an empty user name before '@'".into());
                }
                (Some((user, password)), hostport)
            }
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport, port)?;
        if flavour == Flavour::ServiceBus && credentials.is_none() {
            return Err(
                "sb:// needs a key: sb://KEYNAME:KEY@NAMESPACE.servicebus.windows.net (key \
                 percent-encoded) or an Azure connection string"
                    .into(),
            );
        }
        Ok(Self {
            flavour,
            host,
            port,
            tls,
            credentials,
            entity_path: None,
        })
    }

    fn parse_azure(text: &str) -> Result<Self, String> {
        let mut endpoint = None;
        let mut key_name = None;
        let mut key = None;
        let mut entity_path = None;
        let mut emulator = false;
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or("every part of an Azure connection string must be Name=Value")?;
            match name.trim().to_ascii_lowercase().as_str() {
                "endpoint" => endpoint = Some(value.trim()),
                "sharedaccesskeyname" => key_name = Some(value.trim()),
                "sharedaccesskey" => key = Some(value.trim()),
                "entitypath" => entity_path = Some(value.trim()).filter(|v| !v.is_empty()),
                "usedevelopmentemulator" => emulator = value.trim().eq_ignore_ascii_case("true"),
                "sharedaccesssignature" => {
                    return Err("SharedAccessSignature (SAS token) authentication is not \
                                supported; use SharedAccessKeyName and SharedAccessKey"
                        .into())
                }
                other => {
                    return Err(format!(
                        "unknown part {other:?} in the Azure connection string"
                    ))
                }
            }
        }
        let endpoint = endpoint.ok_or("the Azure connection string has no Endpoint=sb://…")?;
        let rest = endpoint
            .strip_prefix("sb://")
            .ok_or("Endpoint must start with sb://")?;
        let hostport = rest.split('/').next().unwrap_or_default();
        let default_port = if emulator { 5672 } else { 5671 };
        let (host, port) = split_host_port(hostport, default_port)?;
        let key_name = key_name
            .filter(|k| !k.is_empty())
            .ok_or("the Azure connection string has no SharedAccessKeyName (the policy name)")?;
        let key = key
            .filter(|k| !k.is_empty())
            .ok_or("the Azure connection string has no SharedAccessKey")?;
        Ok(Self {
            flavour: Flavour::ServiceBus,
            host,
            port,
            tls: !emulator,
            credentials: Some((key_name.to_owned(), key.to_owned())),
            entity_path: entity_path.map(str::to_owned),
        })
    }
}

fn decode(text: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "is not UTF-8 once percent-decoded".to_owned())
}

fn split_host_port(hostport: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed '[' in the host")?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or("has a port that is not a number from 1 to 65535")?,
        None => default_port,
    };
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AZURE: &str = "Endpoint=sb://shop.servicebus.windows.net/;SharedAccessKeyName=\
                         RootManageSharedAccessKey;SharedAccessKey=ab+c/d=";

    fn config(connection_string: &str) -> ServiceBusConfig {
        ServiceBusConfig {
            connection_string: connection_string.into(),
            ..Default::default()
        }
    }

    #[test]
    fn reads_an_azure_connection_string() {
        let e = Endpoint::parse(AZURE).unwrap();
        assert_eq!(e.flavour, Flavour::ServiceBus);
        assert_eq!(e.host, "shop.servicebus.windows.net");
        assert_eq!(e.port, 5671);
        assert!(e.tls);
        assert_eq!(
            e.credentials,
            Some(("RootManageSharedAccessKey".into(), "ab+c/d=".into()))
        );
        assert_eq!(config(AZURE).address_template(&e), "{destination}");
        let scoped = Endpoint::parse(&format!("{AZURE};EntityPath=orders")).unwrap();
        assert_eq!(config(AZURE).address_template(&scoped), "orders");
        let emulator = Endpoint::parse(
            "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v;\
             UseDevelopmentEmulator=true;",
        )
        .unwrap();
        assert_eq!((emulator.port, emulator.tls), (5672, false));
    }

    #[test]
    fn reads_urls() {
        let e = Endpoint::parse("sb://Key:a%2Bb%2F%3D@ns.servicebus.windows.net").unwrap();
        assert_eq!(e.credentials, Some(("Key".into(), "a+b/=".into())));
        assert_eq!((e.port, e.tls), (5671, true));
        let e = Endpoint::parse("amqp1://guest:guest@127.0.0.1:5673").unwrap();
        assert_eq!((e.flavour, e.port, e.tls), (Flavour::Generic, 5673, false));
        assert_eq!(
            config("amqp1://h").address_template(&e),
            "/exchange/outbox/{destination}"
        );
        let e = Endpoint::parse("amqps1://[::1]").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.tls), ("::1", 5671, true));
        assert_eq!(e.credentials, None);
    }

    #[test]
    fn errors_name_the_field_and_hide_the_secret() {
        for bad in [
            "",
            "nats://x",
            "sb://ns.servicebus.windows.net",
            "amqp1://guest:s3cret@host:99999",
            "amqp1://guest:s3cret@host/vhost",
            "Endpoint=sb://ns/;SharedAccessKey=s3cret",
            "Endpoint=http://ns/;SharedAccessKeyName=k;SharedAccessKey=s3cret",
            "Endpoint=sb://ns/;SharedAccessKeyName=k;SharedAccessKey=s3cret;Bogus=1",
        ] {
            let err = config(bad).validate().unwrap_err();
            assert!(
                err.starts_with("servicebus.connection_string: "),
                "{bad}: {err}"
            );
            assert!(!err.contains("s3cret"), "{err}");
        }
        let c = ServiceBusConfig {
            address: Some(String::new()),
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().starts_with("servicebus.address"));
        let c = ServiceBusConfig {
            ack_timeout: Duration::ZERO,
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .starts_with("servicebus.ack_timeout"));
        let c = ServiceBusConfig {
            max_payload_bytes: 0,
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .starts_with("servicebus.max_payload_bytes"));
        assert!(ServiceBusConfig::default().validate().is_ok());
    }

    #[test]
    fn debug_hides_the_key() {
        let text = format!("{:?}", config(AZURE));
        assert!(!text.contains("ab+c/d="), "{text}");
        assert!(
            text.contains("sb://RootManageSharedAccessKey:***@shop.servicebus.windows.net:5671")
        );
        let text = format!("{:?}", config("amqp1://u:s3cret@h"));
        assert!(!text.contains("s3cret"), "{text}");
    }

    #[test]
    fn a_bare_namespace_url_keeps_the_configured_key() {
        let mut c = config(AZURE);
        c.set_broker_url("sb://shop.servicebus.windows.net".into());
        assert_eq!(c.connection_string, AZURE);
        c.set_broker_url("sb://other.servicebus.windows.net".into());
        assert!(c.validate().is_err(), "another namespace without a key");
        let mut c = config(AZURE);
        c.set_broker_url("amqp1://guest:guest@localhost".into());
        assert_eq!(c.connection_string, "amqp1://guest:guest@localhost");
    }
}
