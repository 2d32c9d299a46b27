//! The history hooks: trace entries, stacks and the clock.
//!
//! Every trace entry of one API call carries the same time: the clock is read at the call's
//! first entry and shared by the rest (`call_time`, cleared when the next call starts). Each
//! entry point that records clears it first.

use super::State;
use crate::clock::{Clock, Source};
use crate::history::{ContextMode, RawAnnotation};
use crate::stacks::{GivenStack, RawStackId, NO_STACK};
use memsnap_format::Action;

impl State {
    /// Interns a captured stack (only while history is on).
    pub fn intern(&mut self, ips: Option<&[usize]>) -> RawStackId {
        match ips {
            Some(ips) if self.history.enabled() && !ips.is_empty() => self.stacks.intern(ips),
            _ => NO_STACK,
        }
    }

    /// The id to record for a given stack: none unless history is on and the context level
    /// is at least `level` (as for a captured stack).
    pub fn given(&self, stack: GivenStack, level: ContextMode) -> RawStackId {
        if self.history.enabled()
            && self.history.options.context >= level
            && self.given_stacks.get(stack.0).is_some()
        {
            stack.0
        } else {
            NO_STACK
        }
    }

    /// Makes the history clock a manual one reading `start_us` (µs since the Unix epoch).
    pub fn use_manual_clock(&mut self, start_us: i64) {
        self.clock = Clock::with_source(Source::Manual);
        self.manual_epoch_us = Some(start_us);
    }

    /// Moves a manual clock forward (other clocks ignore it).
    pub fn advance_clock(&mut self, ns: u64) {
        self.clock.advance(ns);
    }

    /// The history clock now, in µs since the Unix epoch.
    pub fn clock_now_us(&mut self) -> i64 {
        let ns = self.clock.now_ns();
        self.epoch_us(ns)
    }

    /// A clock reading in µs since the Unix epoch.
    pub fn epoch_us(&self, time_ns: u64) -> i64 {
        match self.manual_epoch_us {
            Some(start) => start.saturating_add((time_ns / 1000) as i64),
            None => crate::history::epoch_micros(time_ns),
        }
    }

    /// Records an annotation stamped with the clock (when history is on).
    pub fn record_annotation(&mut self, metadata: Vec<(String, String)>) {
        if !self.history.enabled() {
            return;
        }
        self.call_time = None;
        let time_ns = self.call_time_ns();
        self.history.annotate(RawAnnotation { metadata, time_ns });
    }

    /// Appends a trace entry (when history is on) stamped with the call's clock reading.
    #[inline]
    pub(super) fn record(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: i64,
        stack: RawStackId,
    ) {
        if !self.history.enabled() {
            return;
        }
        let time_ns = self.call_time_ns();
        self.history
            .record(action, addr, size, stream, time_ns, stack);
    }

    /// The call's clock reading (read at its first entry, shared by the others).
    #[inline]
    pub(super) fn call_time_ns(&mut self) -> u64 {
        match self.call_time {
            Some(t) => t,
            None => {
                let t = self.clock.now_ns();
                self.call_time = Some(t);
                t
            }
        }
    }

    /// `free_requested` then `free_completed` of a block freed at once (when history is on).
    #[inline]
    pub(super) fn record_free_pair(
        &mut self,
        addr: u64,
        size: u64,
        stream: i64,
        stack: RawStackId,
    ) {
        if !self.history.enabled() {
            return;
        }
        let time_ns = self.call_time_ns();
        self.history
            .record_free_pair(addr, size, stream, time_ns, stack);
    }

    /// Appends the `snapshot` entry (size = active bytes) after a snapshot collected the trace.
    pub fn record_snapshot_entry(&mut self) {
        self.call_time = None;
        let active = self.stats.active_bytes.0[0].current.max(0) as u64;
        self.record(Action::Snapshot, 0, active, 0, NO_STACK);
    }
}
