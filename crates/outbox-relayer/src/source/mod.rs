//! Where committed events come from. The two sources differ only in how events arrive and how
//! progress is confirmed; both hand rows to the same dispatch ([`crate::dispatch`]) and record
//! outcomes with the same completion ([`crate::complete`]).
//!
//! * [`poll`]: claims the pending rows of the partitions this relay leases, in batches that
//!   adapt to the backlog, several in flight; progress is the rows' state.
//! * [`cdc`]: streams inserts (and table-less messages) from a logical replication slot, in
//!   commit order; progress is the slot's confirmed position.

#[cfg(feature = "postgres")]
pub mod cdc;
pub(crate) mod poll;
