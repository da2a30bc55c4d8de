//! The demo's progress bar, fed by the scenario as it runs.

use indicatif::{ProgressBar, ProgressStyle};
use outbox_example_orders::Observer;

/// A bar of orders applied by every consumer, and the scenario's lines printed above it.
pub struct Bar(ProgressBar);

impl Bar {
    /// A bar for `total` orders.
    pub fn new(total: u64) -> Self {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("  {bar:40} {pos}/{len} orders applied  {msg}")
                .expect("valid template"),
        );
        Self(bar)
    }

    /// Leaves the bar where it got to.
    pub fn finish(&self) {
        self.0.abandon();
    }
}

impl Observer for Bar {
    fn progress(&self, applied: i64, _total: i64, duplicates: u64) {
        self.0
            .set_position(u64::try_from(applied).unwrap_or_default());
        if duplicates > 0 {
            self.0
                .set_message(format!("({duplicates} duplicates discarded)"));
        }
    }

    fn say(&self, line: &str) {
        self.0.suspend(|| println!("  {line}"));
    }
}
