//! Typed handlers: one per event type, each given its payload decoded into the Rust type the
//! writer published ([`outbox::DomainEvent`]), after the type's upcasters ran.

use std::{collections::BTreeMap, fmt, future::Future, marker::PhantomData, sync::Arc};

use futures::future::BoxFuture;
use outbox::DomainEvent;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sqlx::PgConnection;

use crate::{Envelope, Handler, HandlerError, Upcasters};

/// Applies one event type `E` inside the consumer's transaction, with the same contract as
/// [`Handler`]: every database write through `tx`, `Err` to roll back and retry.
///
/// Implement it with an `async fn`:
///
/// ```
/// use outbox_consumer::{Envelope, Handle, HandlerError};
/// use sqlx::PgConnection;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderPlaced {
///     order_id: i64,
///     sku: String,
///     qty: i64,
/// }
///
/// impl outbox::DomainEvent for OrderPlaced {
///     const AGGREGATE_TYPE: &'static str = "order";
///     const EVENT_TYPE: &'static str = "OrderPlaced";
/// }
///
/// struct Inventory;
///
/// impl Handle<OrderPlaced> for Inventory {
///     async fn handle(
///         &self,
///         tx: &mut PgConnection,
///         placed: OrderPlaced,
///         _envelope: &Envelope,
///     ) -> Result<(), HandlerError> {
///         sqlx::query("UPDATE stock SET reserved = reserved + $1 WHERE sku = $2")
///             .bind(placed.qty)
///             .bind(&placed.sku)
///             .execute(tx)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub trait Handle<E>: Send + Sync + 'static {
    /// Applies `event` through `tx`; `envelope` holds the message's metadata (event id,
    /// aggregate id and version, headers).
    fn handle(
        &self,
        tx: &mut PgConnection,
        event: E,
        envelope: &Envelope,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// What [`Handlers`] does with an event type it has no handler for.
enum Unknown {
    /// Dead-letter it at once, with the reason (the default: nothing is acknowledged unseen).
    DeadLetter,
    /// Acknowledge it as applied, doing nothing.
    Skip,
    /// Hand it to an untyped handler.
    Otherwise(Arc<dyn Handler>),
}

/// A [`Handler`] made of one typed handler per event type, with their upcasters.
///
/// A type is an (aggregate type, event type) pair. Each message is routed to its type's handler
/// first (by its `aggregate-type` header; a message without one, to the only handler of its
/// event type), then upcast with that type's own upcasters to its
/// [`SCHEMA_VERSION`](DomainEvent::SCHEMA_VERSION), decoded and handed to its [`Handle`]
/// implementation; two aggregate types may reuse an event type's name with versions and
/// upcasters of their own. What cannot reach a handler in the shape it is written for is
/// dead-lettered at once with the reason: a payload that does not decode, a message newer than
/// the type (a writer deployed ahead of this consumer), an old version with no upcaster chain,
/// a message without an aggregate type whose event type several handlers share. A type with no
/// handler is dead-lettered too, unless [`Handlers::skip_unknown`] or [`Handlers::otherwise`]
/// says otherwise; it is never upcast by another type's upcasters.
///
/// The upcasting happens here, per type, so a `Handlers` gives the [`crate::Processor`] no
/// upcasters of its own ([`Handler::upcasters`] is empty).
///
/// ```
/// # use outbox_consumer::{Envelope, Handle, HandlerError, Handlers};
/// # use sqlx::PgConnection;
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct OrderPlaced { order_id: i64, region: String }
/// # impl outbox::DomainEvent for OrderPlaced {
/// #     const AGGREGATE_TYPE: &'static str = "order";
/// #     const EVENT_TYPE: &'static str = "OrderPlaced";
/// #     const SCHEMA_VERSION: i32 = 2;
/// # }
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct OrderCancelled { order_id: i64 }
/// # impl outbox::DomainEvent for OrderCancelled {
/// #     const AGGREGATE_TYPE: &'static str = "order";
/// #     const EVENT_TYPE: &'static str = "OrderCancelled";
/// # }
/// # struct Inventory;
/// # impl Handle<OrderPlaced> for Inventory {
/// #     async fn handle(&self, _: &mut PgConnection, _: OrderPlaced, _: &Envelope) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// # impl Handle<OrderCancelled> for Inventory {
/// #     async fn handle(&self, _: &mut PgConnection, _: OrderCancelled, _: &Envelope) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// let handlers = Handlers::new()
///     .on::<OrderPlaced>(Inventory)
///     // Version 2 added `region`; version-1 messages are brought up to it.
///     .upcast::<OrderPlaced>(1, |mut v| {
///         v["region"] = "unknown".into();
///         Ok(v)
///     })
///     .on::<OrderCancelled>(Inventory)
///     .skip_unknown();
/// // Processor::new(pool, &tables, "inventory", std::sync::Arc::new(handlers)), or a runner.
/// # let _ = handlers;
/// ```
pub struct Handlers {
    /// Per event type, its routes by aggregate type.
    routes: BTreeMap<&'static str, Vec<ByAggregate>>,
    /// Per (aggregate type, event type), its upcasters and current version.
    upcasters: BTreeMap<TypeKey, Upcasters>,
    unknown: Unknown,
}

/// An (aggregate type, event type) pair.
type TypeKey = (&'static str, &'static str);

/// An aggregate type and the route of its events of one event type.
type ByAggregate = (&'static str, Box<dyn Route>);

impl Default for Handlers {
    fn default() -> Self {
        Self {
            routes: BTreeMap::new(),
            upcasters: BTreeMap::new(),
            unknown: Unknown::DeadLetter,
        }
    }
}

impl fmt::Debug for Handlers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handlers")
            .field("routes", &self.registered())
            .field("upcasters", &self.upcasters)
            .finish_non_exhaustive()
    }
}

impl Handlers {
    /// No handler yet: every event is dead-lettered as unknown.
    pub fn new() -> Self {
        Self::default()
    }

    /// Handles event type `E` with `handler`.
    ///
    /// # Panics
    ///
    /// When `E`'s (aggregate type, event type) already has a handler: a programming error,
    /// found at start-up.
    pub fn on<E>(self, handler: impl Handle<E>) -> Self
    where
        E: DomainEvent + DeserializeOwned + Send + 'static,
    {
        self.route::<E>(Box::new(Typed {
            handler,
            event: PhantomData,
        }))
    }

    /// Handles event type `E` with a closure returning a boxed future
    /// (`|tx, event, envelope| Box::pin(async move { … })`), for handlers too small for a type.
    ///
    /// # Panics
    ///
    /// As [`Handlers::on`].
    pub fn on_fn<E, F>(self, handler: F) -> Self
    where
        E: DomainEvent + DeserializeOwned + Send + 'static,
        F: for<'a> Fn(
                &'a mut PgConnection,
                E,
                &'a Envelope,
            ) -> BoxFuture<'a, Result<(), HandlerError>>
            + Send
            + Sync
            + 'static,
    {
        self.on::<E>(Closure(handler))
    }

    /// Registers the upcaster of `E`'s payload from schema version `from` to `from + 1` (see
    /// [`Upcasters`]); the chain ends at `E::SCHEMA_VERSION`. It applies to `E`'s aggregate type
    /// only.
    ///
    /// # Panics
    ///
    /// When `from` is not below `E::SCHEMA_VERSION` or is registered twice.
    pub fn upcast<E: DomainEvent>(
        mut self,
        from: i32,
        upcast: impl Fn(Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        let upcasters = self.upcasters_of::<E>();
        *upcasters = std::mem::take(upcasters).register(E::EVENT_TYPE, from, upcast);
        self
    }

    /// Acknowledges events of types with no handler as applied, doing nothing: for a consumer
    /// of a stream that carries other types too. (With a version gate they still take their
    /// turn in their aggregate's order.) A message whose event type has handlers but that names
    /// no aggregate type, when several handlers share its event type, is not a type with no
    /// handler: it is dead-lettered whatever this says.
    pub fn skip_unknown(mut self) -> Self {
        self.unknown = Unknown::Skip;
        self
    }

    /// Hands events of types with no typed handler to `handler`, untyped, upcast with its own
    /// [`Handler::upcasters`].
    pub fn otherwise(mut self, handler: impl Handler) -> Self {
        self.unknown = Unknown::Otherwise(Arc::new(handler));
        self
    }

    /// The registered (aggregate type, event type) pairs, sorted.
    pub fn registered(&self) -> Vec<TypeKey> {
        let mut pairs: Vec<_> = self
            .routes
            .iter()
            .flat_map(|(event_type, routes)| routes.iter().map(|(a, _)| (*a, *event_type)))
            .collect();
        pairs.sort_unstable();
        pairs
    }

    /// `E`'s upcasters, declaring its current version.
    fn upcasters_of<E: DomainEvent>(&mut self) -> &mut Upcasters {
        let upcasters = self
            .upcasters
            .entry((E::AGGREGATE_TYPE, E::EVENT_TYPE))
            .or_default();
        *upcasters = std::mem::take(upcasters).current(E::EVENT_TYPE, E::SCHEMA_VERSION);
        upcasters
    }

    fn route<E: DomainEvent>(mut self, route: Box<dyn Route>) -> Self {
        let routes = self.routes.entry(E::EVENT_TYPE).or_default();
        assert!(
            routes.iter().all(|(a, _)| *a != E::AGGREGATE_TYPE),
            "{}/{}: a handler is registered twice",
            E::AGGREGATE_TYPE,
            E::EVENT_TYPE
        );
        routes.push((E::AGGREGATE_TYPE, route));
        self.upcasters_of::<E>();
        self
    }

    /// Where `envelope` goes: by event type, then by aggregate type (a message without one
    /// goes to the only handler of its event type).
    fn find(&self, envelope: &Envelope) -> Found<'_> {
        let Some((event_type, routes)) = self.routes.get_key_value(envelope.event_type.as_str())
        else {
            return Found::Unknown;
        };
        let kind = envelope.aggregate_type.as_deref().filter(|k| !k.is_empty());
        let route = match (kind, routes.as_slice()) {
            (Some(kind), _) => routes.iter().find(|(a, _)| *a == kind),
            (None, [only]) => Some(only),
            (None, _) => return Found::Ambiguous,
        };
        match route {
            Some((kind, route)) => Found::Route((kind, event_type), route.as_ref()),
            None => Found::Unknown,
        }
    }

    fn unknown_reason(&self, envelope: &Envelope) -> String {
        let registered = self
            .registered()
            .iter()
            .map(|(a, e)| format!("{a}/{e}"))
            .collect::<Vec<_>>();
        format!(
            "no handler for {}/{} (handled: {})",
            envelope.aggregate_type.as_deref().unwrap_or("-"),
            envelope.event_type,
            if registered.is_empty() {
                "none".to_owned()
            } else {
                registered.join(", ")
            }
        )
    }
}

/// Where a message goes.
enum Found<'a> {
    /// To this type's route.
    Route(TypeKey, &'a dyn Route),
    /// Its event type has several handlers and it names no aggregate type.
    Ambiguous,
    /// Nowhere: a type with no handler.
    Unknown,
}

/// `envelope` at the current version `upcasters` give its event type (unchanged when it is, or
/// when they know nothing of it), or a permanent failure saying why it cannot be.
fn current<'e>(
    upcasters: &Upcasters,
    envelope: &'e Envelope,
) -> Result<std::borrow::Cow<'e, Envelope>, HandlerError> {
    upcasters.to_current(envelope).map_err(|e| match e {
        crate::UpcastError::Panicked { .. } => HandlerError::upcast_panicked(e.to_string()),
        _ => HandlerError::permanent(e.to_string()),
    })
}

impl Handler for Handlers {
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        match self.find(event) {
            Found::Route(key, route) => Box::pin(async move {
                let upcasters = self.upcasters.get(&key).expect("declared with its route");
                let event = current(upcasters, event)?;
                route.call(tx, &event).await
            }),
            Found::Ambiguous => {
                let reason = format!(
                    "{} names no aggregate type, and several handle it: {}",
                    event.event_type,
                    self.registered()
                        .iter()
                        .filter(|(_, e)| *e == event.event_type)
                        .map(|(a, e)| format!("{a}/{e}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                Box::pin(async move { Err(HandlerError::permanent(reason)) })
            }
            Found::Unknown => match &self.unknown {
                Unknown::DeadLetter => {
                    let reason = self.unknown_reason(event);
                    Box::pin(async move { Err(HandlerError::permanent(reason)) })
                }
                Unknown::Skip => Box::pin(async { Ok(()) }),
                Unknown::Otherwise(handler) => Box::pin(async move {
                    let upcasters = handler.upcasters();
                    let event = current(&upcasters, event)?;
                    handler.handle(tx, &event).await
                }),
            },
        }
    }
}

/// A typed handler behind the untyped seam.
trait Route: Send + Sync {
    fn call<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

struct Typed<E, H> {
    handler: H,
    event: PhantomData<fn() -> E>,
}

impl<E, H> Route for Typed<E, H>
where
    E: DomainEvent + DeserializeOwned + Send + 'static,
    H: Handle<E>,
{
    fn call<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let event = decode::<E>(envelope)?;
            self.handler.handle(tx, event, envelope).await
        })
    }
}

/// `envelope`'s payload as `E`, or a permanent failure saying why: the processor has upcast it
/// to its current version already, so a version other than `E`'s or a payload of another
/// shape can never succeed on a retry.
fn decode<E: DomainEvent + DeserializeOwned>(envelope: &Envelope) -> Result<E, HandlerError> {
    if envelope.schema_version != E::SCHEMA_VERSION {
        return Err(HandlerError::permanent(format!(
            "{}/{} schema_version {} is not the handler's {} (no upcaster chain to it)",
            E::AGGREGATE_TYPE,
            E::EVENT_TYPE,
            envelope.schema_version,
            E::SCHEMA_VERSION
        )));
    }
    envelope.json().map_err(|e| {
        HandlerError::permanent(format!(
            "{}/{} schema_version {}: the payload does not decode as {}: {e}",
            E::AGGREGATE_TYPE,
            E::EVENT_TYPE,
            envelope.schema_version,
            std::any::type_name::<E>()
        ))
    })
}

/// A closure as a [`Handle`].
struct Closure<F>(F);

impl<E, F> Handle<E> for Closure<F>
where
    E: Send + 'static,
    F: for<'a> Fn(&'a mut PgConnection, E, &'a Envelope) -> BoxFuture<'a, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static,
{
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: E,
        envelope: &Envelope,
    ) -> Result<(), HandlerError> {
        (self.0)(tx, event, envelope).await
    }
}
