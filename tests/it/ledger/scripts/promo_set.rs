//! `promo set` (the admin API) and what the scripts read from what it
//! writes.

use super::*;
use crate::common::redis::*;
use deductor::admin::{self, AdminError, PromoSetResult, PromoSpec};
use deductor::domain::decision::Reason;

#[tokio::test]
async fn promo_set_refuses_without_force_and_replaces_with_it() {
    let r = standalone().await;
    let p = id("flash");
    let spec = PromoSpec {
        budget: Some(1000),
        stock: Some(10),
        per_customer: Some(1),
        starts_at: Some(1_000),
        ends_at: Some(2_000_000_000),
        paused: false,
    };
    assert_eq!(
        admin::promo_set(&r.ledger, &p, spec.clone(), false)
            .await
            .unwrap(),
        PromoSetResult::Created
    );
    let v = admin::promo_show(&r.ledger, &p)
        .await
        .unwrap()
        .expect("exists");
    assert_eq!(
        (v.budget, v.stock, v.per_customer),
        (Some(1000), Some(10), Some(1))
    );
    assert_eq!(
        (v.initial_budget, v.initial_stock, v.paused),
        (Some(1000), Some(10), false)
    );
    assert_eq!((v.starts_at, v.ends_at), (Some(1_000), Some(2_000_000_000)));
    assert!(v.to_string().contains("flash"));

    let other = PromoSpec {
        budget: Some(5),
        paused: true,
        ..PromoSpec::default()
    };
    let e = admin::promo_set(&r.ledger, &p, other.clone(), false)
        .await
        .unwrap_err();
    assert!(matches!(e, AdminError::Exists(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "promotion flash exists; pass --force to overwrite"
    );
    assert_eq!(
        admin::promo_show(&r.ledger, &p).await.unwrap().unwrap(),
        v,
        "unchanged"
    );

    assert_eq!(
        admin::promo_set(&r.ledger, &p, other, true).await.unwrap(),
        PromoSetResult::Replaced
    );
    let v = admin::promo_show(&r.ledger, &p).await.unwrap().unwrap();
    assert_eq!(
        (v.budget, v.stock, v.per_customer, v.paused),
        (Some(5), None, None, true)
    );
    assert_eq!(v.initial_budget, Some(5));
    let fields = r.hgetall(&r.keys().promotion(&p)).await;
    // budget, initial_budget, status, gen and, on a standalone server,
    // `indexed` (the day the incarnation began: its records are indexed).
    assert_eq!(fields.len(), 5, "the whole hash was replaced: {fields:?}");
    assert!(fields.contains_key("indexed"), "{fields:?}");
    assert_eq!(fields["gen"], "2", "a new incarnation");

    // What promo set writes is what the scripts read.
    let d = r
        .ledger
        .place(&placed("e1", "o1", "c", T, &[("flash", 1, 0)]))
        .await
        .unwrap();
    assert_eq!(rejected(&d).1, Reason::PromotionInactive);
    assert!(admin::promo_show(&r.ledger, &id("absent"))
        .await
        .unwrap()
        .is_none());
    let e = admin::promo_set(
        &r.ledger,
        &p,
        PromoSpec {
            starts_at: Some(5),
            ends_at: Some(5),
            ..Default::default()
        },
        true,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, AdminError::Invalid(_)), "{e}");
}
