//! Orders out of lines: a multi-line placement is all-or-nothing (earlier
//! lines are released when a later one is rejected) and decides the same
//! way on every delivery (a stored rejection of the event on any line is
//! looked up first, in one round trip); a refund applies each line on its
//! own, to the customer its deduction counted for.

use super::calls;
use super::reply::{self, LineReply, LineStatus, ReleaseReply, RollbackReply};
use super::{scripts, Ledger, LedgerError};
use crate::domain::decision::{
    AcceptedLine, PlaceDecision, Reason, RefundDecision, RefundLineResult, Remaining,
};
use crate::domain::event::{Header, Id, OrderPlaced, OrderRefunded, PlaceLine, RefundLine};

impl Ledger {
    /// Decides and applies an `OrderPlaced`, all lines or none.
    ///
    /// Corrupt stored data on any line (a `CORRUPT` reply of any script,
    /// memo reads included) ends as a `corrupt_promotion` rejection, never
    /// as an error: deduct.lua remembers it under the line's memo, and the
    /// lines already deducted are released and marked like for any other
    /// rejection, so every delivery of the event repeats the decision.
    ///
    /// With the durability gate on, returns only once enough replicas have
    /// the event's writes ([`durability`]).
    pub async fn place(&self, e: &OrderPlaced) -> Result<PlaceDecision, LedgerError> {
        let gate = self.gate(&e.header.order_id);
        let mut tries = 0;
        let decision = loop {
            match self.decide_place(e).await {
                // A line's promotion is bucketed: its layout is learnt, and
                // the event decided again (nothing was written for that
                // line; the lines before it answer as before).
                Err(err) if err.class() == super::ErrorClass::Bucketed && tries < 3 => {
                    tries += 1;
                    self.learn_layouts(e.lines.iter().map(line_promotion))
                        .await?;
                }
                other => break other?,
            }
        };
        self.durable(gate, e.lines.iter().map(|l| &l.promotion_id))
            .await?;
        Ok(decision)
    }

    async fn decide_place(&self, e: &OrderPlaced) -> Result<PlaceDecision, LedgerError> {
        let h = &e.header;
        if e.lines.len() > 1 {
            // One decision per event: a redelivery of a rejected event is
            // rejected again, whatever the other lines would say now. The
            // first line's stored rejection is read by deduct.lua itself
            // (step 0) before it deducts anything; the other lines' are read
            // here, all at once (one round trip), before the first deduct.
            if let Some((p, reason, duplicate)) = self.stored_rejection(h, &e.lines[1..]).await? {
                // An earlier delivery may have stopped before releasing.
                self.release(h, &e.lines, Some(p)).await?;
                return Ok(rejected(duplicate, reason, p));
            }
        }
        let mut accepted = Vec::with_capacity(e.lines.len());
        let mut all_duplicate = true;
        for (i, line) in e.lines.iter().enumerate() {
            let p = &line.promotion_id;
            let reply = match self.deduct_line(e, i).await? {
                Ok(reply) => reply,
                Err(corrupt) => return Ok(corrupt),
            };
            match reply.status {
                LineStatus::Done => {
                    all_duplicate &= reply.duplicate;
                    accepted.push(AcceptedLine {
                        promotion_id: p.clone(),
                        budget: reply.budget,
                        stock: reply.stock,
                        remaining: reply.remaining,
                    });
                }
                LineStatus::Released => {
                    // Another delivery of this event decided it while this
                    // one was on its way: repeat that decision, whose reason
                    // is stored on the failing line.
                    self.release(h, &e.lines[..i], None).await?;
                    return match self.stored_rejection(h, &e.lines).await? {
                        Some((q, reason, _)) => Ok(rejected(true, reason, q)),
                        None => self.redecide_released(e, i).await,
                    };
                }
                LineStatus::Rejected(reason) => {
                    self.release_others(h, &e.lines, i, reply.duplicate).await?;
                    return Ok(rejected(reply.duplicate, reason, p));
                }
            }
        }
        Ok(PlaceDecision::Accepted {
            duplicate: all_duplicate,
            lines: accepted,
        })
    }

    /// Line `i` of `e` is marked released, but no line holds the event's
    /// reason: it expired before the mark, or it was written on a Redis node
    /// that then failed over before replicating it (the event was not
    /// published then: the durability gate had not passed). The lines after
    /// `i` were released or never decided: they are decided again, and the
    /// first rejection is the event's decision (the lines deducted meanwhile
    /// are released). Only when none rejects is the event rejected
    /// `order_reverted`, with every line released: a released line is never
    /// deducted again.
    async fn redecide_released(
        &self,
        e: &OrderPlaced,
        i: usize,
    ) -> Result<PlaceDecision, LedgerError> {
        let h = &e.header;
        for (j, line) in e.lines.iter().enumerate().skip(i + 1) {
            let q = &line.promotion_id;
            let reply = match self.deduct_line(e, j).await? {
                Ok(reply) => reply,
                Err(corrupt) => return Ok(corrupt),
            };
            match reply.status {
                LineStatus::Done | LineStatus::Released => {}
                LineStatus::Rejected(reason) => {
                    self.release_others(h, &e.lines, j, reply.duplicate).await?;
                    return Ok(rejected(reply.duplicate, reason, q));
                }
            }
        }
        self.release(h, &e.lines, None).await?;
        Ok(rejected(
            true,
            Reason::OrderReverted,
            &e.lines[i].promotion_id,
        ))
    }

    /// The first stored rejection of the event on `lines` (in line order),
    /// with its promotion and whether it was read back; all memos are read
    /// at once (one round trip). A memo that is itself corrupt is a
    /// `corrupt_promotion` rejection on its line (every delivery meets it).
    async fn stored_rejection<'a>(
        &self,
        h: &Header,
        lines: &'a [PlaceLine],
    ) -> Result<Option<(&'a Id, Reason, bool)>, LedgerError> {
        let lookups = lines.iter().map(|line| {
            let p = &line.promotion_id;
            let layout = self.layout(p);
            let call = calls::memo(self.keys(), h, p);
            let batcher = self.shared.memo_batcher.as_ref();
            async move {
                let memo = match layout {
                    Some(l) => self.bucket_memo(h, &l).await,
                    None => self
                        .batched(batcher, call, &h.order_id, p)
                        .await
                        .and_then(reply::decode_memo),
                };
                (p, memo)
            }
        });
        for (p, result) in futures::future::join_all(lookups).await {
            match result {
                Ok(Some(reason)) => return Ok(Some((p, reason, true))),
                Ok(None) => {}
                Err(err) if err.is_corrupt() => {
                    self.report_corrupt(h, p, &err);
                    return Ok(Some((p, Reason::CorruptPromotion, false)));
                }
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }

    /// Applies an `OrderRefunded`, each line on its own.
    ///
    /// A refund acts on the customer its deduction counted for (stored in
    /// the record), not on the one the refund event names: when they
    /// differ, rollback.lua writes nothing and names the stored customer,
    /// and the line is applied again with that customer's counter. The
    /// mismatch is logged and counted in
    /// `deductor_refund_customer_mismatch_total`.
    ///
    /// With the durability gate on, returns only once enough replicas have
    /// the event's writes ([`durability`]).
    pub async fn refund(&self, e: &OrderRefunded) -> Result<RefundDecision, LedgerError> {
        let gate = self.gate(&e.header.order_id);
        let mut tries = 0;
        let decision = loop {
            match self.decide_refund(e).await {
                // As in `place`: rollback.lua wrote nothing on that line.
                Err(err) if err.class() == super::ErrorClass::Bucketed && tries < 3 => {
                    tries += 1;
                    self.learn_layouts(e.lines.iter().map(line_promotion))
                        .await?;
                }
                other => break other?,
            }
        };
        self.durable(gate, e.lines.iter().map(|l| &l.promotion_id))
            .await?;
        Ok(decision)
    }

    async fn decide_refund(&self, e: &OrderRefunded) -> Result<RefundDecision, LedgerError> {
        let h = &e.header;
        let mut lines = Vec::with_capacity(e.lines.len());
        for line in &e.lines {
            let p = &line.promotion_id;
            let result = match self.rollback(h, line).await {
                Ok(r) => refund_line(p, r),
                Err(err) if err.is_corrupt() => {
                    self.report_corrupt(h, p, &err);
                    RefundLineResult {
                        promotion_id: p.clone(),
                        status: Err(Reason::CorruptPromotion),
                        duplicate: false,
                        budget: 0,
                        stock: 0,
                        remaining: Remaining::default(),
                    }
                }
                Err(err) => return Err(err),
            };
            lines.push(result);
        }
        Ok(RefundDecision { lines })
    }

    async fn rollback(&self, h: &Header, line: &RefundLine) -> Result<LineReply, LedgerError> {
        let p = &line.promotion_id;
        if let Some(layout) = self.layout(p) {
            return self.bucket_refund(h, p, &layout).await;
        }
        let mut customer = h.customer_id.clone();
        // At most one switch is expected; a record that changes hands again
        // meanwhile (a racing delivery) gets one more try.
        for _ in 0..3 {
            let call = calls::rollback(
                self.keys(),
                &self.shared.ttl,
                h,
                line,
                &customer,
                calls::today(),
            );
            let batcher = self.shared.rollback_batcher.as_ref();
            let reply = self.batched(batcher, call, &h.order_id, p).await?;
            match reply::decode_rollback(reply)? {
                RollbackReply::Line(r) => return Ok(r),
                RollbackReply::Customer(stored) => {
                    tracing::warn!(
                        promotion = %p,
                        order = %h.order_id,
                        event = %h.event_id,
                        named = %h.customer_id,
                        stored = %stored,
                        "refund names another customer than the deduction; applied to the deduction's customer"
                    );
                    crate::metrics::refund_customer_mismatch();
                    customer = stored;
                }
            }
        }
        Err(LedgerError::malformed(
            scripts::ROLLBACK.name,
            "the record's customer kept changing",
        ))
    }

    /// Deducts line `i` of `e`. Corrupt data on it ends the event: it is
    /// reported, the other lines are released, and the `corrupt_promotion`
    /// rejection comes back as `Err` (deduct.lua stored it under the line's
    /// memo, unless the memo itself is what is corrupt).
    ///
    /// The lines after `i` are released too, always: corrupt data can
    /// appear between two deliveries of the event (a record or a field
    /// damaged after delivery 1 deducted every line but was never
    /// published), and then delivery 2 meets it on line `i` while the later
    /// lines still hold delivery 1's deductions. As in
    /// [`Self::release_later`], corrupt data met there is reported and
    /// skipped (issue 23, defect 6).
    async fn deduct_line(
        &self,
        e: &OrderPlaced,
        i: usize,
    ) -> Result<Result<LineReply, PlaceDecision>, LedgerError> {
        let (h, line) = (&e.header, &e.lines[i]);
        match self.deduct(h, line).await {
            Ok(reply) => Ok(Ok(reply)),
            Err(err) if err.is_corrupt() => {
                let p = &line.promotion_id;
                self.report_corrupt(h, p, &err);
                self.release_later(h, &e.lines[i + 1..]).await?;
                self.release(h, &e.lines[..i], None).await?;
                Ok(Err(rejected(false, Reason::CorruptPromotion, p)))
            }
            Err(err) => Err(err),
        }
    }

    async fn deduct(&self, h: &Header, line: &PlaceLine) -> Result<LineReply, LedgerError> {
        if let Some(layout) = self.layout(&line.promotion_id) {
            return self.bucket_deduct(h, line, &layout).await;
        }
        let call = calls::deduct(self.keys(), &self.shared.ttl, h, line, calls::today());
        let batcher = self.shared.batcher.as_ref();
        let reply = self
            .batched(batcher, call, &h.order_id, &line.promotion_id)
            .await?;
        reply::decode_deduct(reply)
    }

    /// The lines of `lines` other than `failing`, the one that rejected the
    /// event, released: those before it always (this attempt deducted
    /// them). Those after it only where an earlier attempt of the event can
    /// have deducted them while the failing line, decided before them, now
    /// rejects: when the rejection was read back (an earlier attempt or
    /// delivery decided it, and may have stopped before releasing), or when
    /// the durability gate is on. With replicated Redis a failover can lose
    /// an earlier attempt's deduction of the failing line (the gate had not
    /// passed, so nothing was published) while its deduction of a later line,
    /// on another primary of a Cluster, survives: the failing line then
    /// rejects afresh, and only releasing the later lines keeps the rejected
    /// event from holding them. (Found by `scripts/chaos --failover` on a
    /// Cluster: docs/reliability.md, finding 6.)
    async fn release_others(
        &self,
        h: &Header,
        lines: &[PlaceLine],
        failing: usize,
        read_back: bool,
    ) -> Result<(), LedgerError> {
        if read_back || self.shared.wait_replicas > 0 {
            self.release_later(h, &lines[failing + 1..]).await?;
        }
        self.release(h, &lines[..failing], None).await
    }

    /// The lines after a failing line, released where this event holds a
    /// deduction, which only lost writes (see [`Self::release_others`]) or
    /// data corrupted between two deliveries (see [`Self::deduct_line`])
    /// can leave there: most often there is nothing. So corrupt
    /// data met here is reported and skipped, not waited out like in
    /// [`Self::release`], where the event surely holds the line.
    async fn release_later(&self, h: &Header, lines: &[PlaceLine]) -> Result<(), LedgerError> {
        for line in lines {
            let p = &line.promotion_id;
            match self.release_one(h, line).await {
                Ok(released) => {
                    if released {
                        tracing::warn!(
                            promotion = %p,
                            order = %h.order_id,
                            event = %h.event_id,
                            "released a line after the rejecting one: an earlier attempt deducted it \
                             (lost writes after a Redis failover, or data corrupted since)"
                        );
                    }
                }
                Err(err) if err.is_corrupt() => self.report_corrupt(h, p, &err),
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Releases what this event deducted on `lines` (no-op where it deducted
    /// nothing) and marks each line's memo `released`, so a slower delivery
    /// of the event repeats the decision instead of deducting afresh.
    ///
    /// A line whose release meets corrupt data (release.lua writes nothing
    /// then) is not skipped: skipping would leave the rejected event holding
    /// that deduction, which a later refund would then give back. The other
    /// lines are still released, and the call fails with
    /// [`LedgerError::ReleaseBlocked`], which the pipeline retries with
    /// backoff until the data is repaired. The retry repeats the decision:
    /// the rejection's reason is stored on its line, so it is found again.
    ///
    /// The exception is `failing`, the line whose stored reason rejected the
    /// event (when `lines` includes it): it holds no deduction of the event
    /// (deduct.lua stores a reason only where it deducts nothing), so corrupt
    /// data there, its own corrupt memo included, is reported and skipped.
    async fn release(
        &self,
        h: &Header,
        lines: &[PlaceLine],
        failing: Option<&Id>,
    ) -> Result<(), LedgerError> {
        let mut blocked = None;
        for line in lines {
            let p = &line.promotion_id;
            match self.release_one(h, line).await {
                Ok(released) => {
                    if released {
                        tracing::debug!(promotion = %p, order = %h.order_id, "released line");
                    }
                }
                Err(err) if err.is_corrupt() && failing == Some(p) => {
                    self.report_corrupt(h, p, &err)
                }
                Err(err) if err.is_corrupt() => {
                    tracing::error!(
                        promotion = %p,
                        order = %h.order_id,
                        event = %h.event_id,
                        error = %err,
                        "corrupt promotion data blocks the release of a rejected placement's line; \
                         the event is retried until the field is repaired (docs/operations.md, DeductorCorruptData)"
                    );
                    crate::metrics::corrupt_data();
                    if blocked.is_none() {
                        blocked = Some(LedgerError::release_blocked(
                            p.as_str(),
                            h.order_id.as_str(),
                            err,
                        ));
                    }
                }
                Err(err) => return Err(err),
            }
        }
        blocked.map_or(Ok(()), Err)
    }

    /// release.lua for one line: whether it gave a deduction of the event back.
    ///
    /// A record the event holds may have counted another customer's slot:
    /// a deduction handed over to this event from an absorbed one of
    /// another customer (issue 23's paper case). release.lua then writes
    /// nothing and names that customer, and the line is released again
    /// with that customer's counter, so the slot goes back to whom it
    /// counted for (before, it was never given back).
    async fn release_one(&self, h: &Header, line: &PlaceLine) -> Result<bool, LedgerError> {
        if let Some(layout) = self.layout(&line.promotion_id) {
            return self.bucket_release(h, &layout).await;
        }
        let mut customer = h.customer_id.clone();
        // One switch is expected; a record changing hands again meanwhile
        // (a racing delivery) gets one more try.
        for _ in 0..3 {
            let call = calls::release(self.keys(), &self.shared.ttl, h, line, &customer);
            let batcher = self.shared.release_batcher.as_ref();
            let reply = self
                .batched(batcher, call, &h.order_id, &line.promotion_id)
                .await?;
            match reply::decode_release(reply)? {
                ReleaseReply::Released(released) => return Ok(released),
                ReleaseReply::Customer(stored) => customer = stored,
            }
        }
        Err(LedgerError::malformed(
            scripts::RELEASE.name,
            "the record's customer kept changing",
        ))
    }
}

fn line_promotion<L: HasPromotion>(l: &L) -> &Id {
    l.promotion()
}

trait HasPromotion {
    fn promotion(&self) -> &Id;
}

impl HasPromotion for PlaceLine {
    fn promotion(&self) -> &Id {
        &self.promotion_id
    }
}

impl HasPromotion for RefundLine {
    fn promotion(&self) -> &Id {
        &self.promotion_id
    }
}

fn rejected(duplicate: bool, reason: Reason, p: &Id) -> PlaceDecision {
    PlaceDecision::Rejected {
        duplicate,
        reason,
        promotion_id: p.clone(),
    }
}

fn refund_line(p: &Id, r: LineReply) -> RefundLineResult {
    RefundLineResult {
        promotion_id: p.clone(),
        status: r.result(),
        duplicate: r.duplicate,
        budget: r.budget,
        stock: r.stock,
        remaining: r.remaining,
    }
}
