use super::*;

fn price(input: f64, output: f64, cache_write: f64, cache_read: f64) -> Price {
    Price {
        per_search_unit: 0.0,
        input_per_mtok: input,
        output_per_mtok: output,
        cache_write_per_mtok: cache_write,
        cache_read_per_mtok: cache_read,
    }
}

#[test]
fn the_shipped_catalogue_reads_and_covers_the_pinned_clis_models() {
    let catalogue = catalogue();
    assert_eq!(catalogue.as_of(), "2026-12-04");
    // Claude Code 2.1.332's aliases and Codex 0.171.0's default, at their published prices.
    for (model, expected) in [
        ("claude-opus-5-5", price(4.0, 20.0, 5.0, 0.2)),
        ("claude-sonnet-5-5", price(2.0, 10.0, 2.5, 0.1)),
        ("claude-haiku-5-5", price(0.1, 0.5, 0.125, 0.01)),
        ("claude-fable-5-2", price(8.0, 40.0, 10.0, 0.2)),
        ("gpt-6.2-sol", price(2.0, 10.0, 2.5, 0.1)),
        ("claude-haiku-4-5", price(1.0, 5.0, 1.25, 0.1)),
    ] {
        assert_eq!(
            catalogue.get(model).map(|entry| entry.price),
            Some(expected),
            "{model}"
        );
    }
    // Every model of Codex's bundled list that the API prices.
    for model in [
        "gpt-6.2-sol",
        "gpt-6.2-astra",
        "gpt-6.1-terra",
        "gpt-6.1-sol",
        "gpt-6-astra",
        "gpt-6-sol",
        "gpt-6-luna",
        "gpt-5.6-sol",
        "gpt-5.6-terra",
        "gpt-5.6-luna",
        "gpt-5.5",
    ] {
        assert!(catalogue.get(model).is_some(), "{model}");
    }
    // Retired models are left out (so they do not raise a family's fallback).
    assert!(catalogue.get("claude-opus-4-1-20250805").is_none());
    assert!(catalogue.get("claude-sonnet-4-5-20250929").is_none());
}

#[test]
fn families_are_the_documented_prefixes() {
    for (model, expected) in [
        ("claude-opus-6", Some("claude-opus-")),
        ("claude-opus-4-5-20251101", Some("claude-opus-")),
        ("claude-3-7-sonnet-20250219", Some("claude-sonnet-")),
        ("claude-haiku-9-1", Some("claude-haiku-")),
        ("claude-fable-5-3", Some("claude-fable-")),
        ("claude-mythos-6", Some("claude-mythos-")),
        ("claude-nova-1", None),
        ("gpt-6.3-nova", Some("gpt-6")),
        ("gpt-6", Some("gpt-6")),
        ("gpt-5.3-codex-spark", Some("gpt-5")),
        ("gpt-5.5-pro", Some("gpt-5-pro")),
        ("gpt-60", Some("gpt-60")),
        ("gpt-x", None),
        ("gpt-6x", None),
        ("o3", Some("o3")),
        ("o3-2025-04-16", Some("o3")),
        ("o3-pro", Some("o3-pro")),
        ("opus", None),
        // Embedding models are their own family: an unknown one falls back to the highest
        // embedding price, never a chat model's.
        ("text-embedding-3-small", Some("text-embedding-")),
        ("text-embedding-4", Some("text-embedding-")),
        ("rerank-v3.5", None),
    ] {
        assert_eq!(family(model).as_deref(), expected, "{model}");
    }
}

#[test]
fn the_operators_price_wins_over_the_catalogue_and_the_catalogue_over_the_fallback() {
    let mut operator = HashMap::new();
    let own = price(1.0, 2.0, 3.0, 4.0);
    operator.insert("claude-opus-5-5".to_owned(), own);
    let priced = price_of(
        &operator,
        "claude-opus-5-5",
        Platform::Anthropic,
        UnpricedPolicy::Fallback,
    );
    assert_eq!((priced.price, priced.source), (own, PriceSource::Operator));
    // A free price set by the operator is a price, not "none".
    operator.insert("free-model".to_owned(), Price::default());
    let free = price_of(
        &operator,
        "free-model",
        Platform::OpenAi,
        UnpricedPolicy::Refuse,
    );
    assert_eq!(free.source, PriceSource::Operator);
    let catalogue = price_of(
        &operator,
        "claude-sonnet-5-5",
        Platform::Anthropic,
        UnpricedPolicy::Refuse,
    );
    assert_eq!(
        (catalogue.price, catalogue.source),
        (price(2.0, 10.0, 2.5, 0.1), PriceSource::Catalogue)
    );
}

#[test]
fn a_model_released_tomorrow_costs_its_familys_highest_price_never_nothing() {
    let none = HashMap::new();
    let opus = price_of(
        &none,
        "claude-opus-6",
        Platform::Anthropic,
        UnpricedPolicy::Fallback,
    );
    // Opus 4.6–5 (5/25/6.25/0.50) are above Opus 5.5 (4/20/5/0.20) in every component.
    assert_eq!(opus.price, price(5.0, 25.0, 6.25, 0.5));
    assert_eq!(opus.source, PriceSource::Fallback);
    assert_eq!(opus.fallback_from, "claude-opus-*");
    let gpt = price_of(
        &none,
        "gpt-6.3-nova",
        Platform::OpenAi,
        UnpricedPolicy::Fallback,
    );
    assert_eq!(
        gpt.price,
        price(10.0, 50.0, 12.5, 1.0),
        "gpt-6-astra is the family's highest"
    );
    assert_eq!(gpt.fallback_from, "gpt-6*");
    let spark = price_of(
        &none,
        "gpt-5.3-codex-spark",
        Platform::OpenAi,
        UnpricedPolicy::Fallback,
    );
    assert_eq!(
        spark.price,
        price(5.0, 30.0, 6.25, 0.5),
        "not the -pro family's"
    );
    // No family: the platform's highest price, per component.
    let odd = price_of(
        &none,
        "my-finetune",
        Platform::Anthropic,
        UnpricedPolicy::Fallback,
    );
    assert_eq!(odd.price, price(10.0, 50.0, 12.5, 1.0));
    assert_eq!(odd.fallback_from, "anthropic:*");
    let odd = price_of(
        &none,
        "my-finetune",
        Platform::OpenAi,
        UnpricedPolicy::Fallback,
    );
    assert_eq!(odd.price, price(30.0, 180.0, 30.0, 30.0));
    assert_eq!(odd.fallback_from, "openai:*");
    for model in ["claude-opus-6", "gpt-6.3-nova", "my-finetune"] {
        for platform in [Platform::Anthropic, Platform::OpenAi] {
            let priced = price_of(&none, model, platform, UnpricedPolicy::Fallback);
            assert!(priced.price.input_per_mtok > 0.0 && priced.price.output_per_mtok > 0.0);
        }
    }
}

#[test]
fn under_the_refuse_policy_an_unpriced_model_has_no_price() {
    let none = HashMap::new();
    let priced = price_of(
        &none,
        "claude-opus-6",
        Platform::Anthropic,
        UnpricedPolicy::Refuse,
    );
    assert_eq!(priced, ModelPrice::refused());
}

#[test]
fn a_bad_catalogue_is_refused_naming_the_entry() {
    let head = "as_of: \"2026-12-04\"\nmodels:\n";
    let entry = |model: &str, platform: &str, input: &str| {
        format!(
            "  - {{ model: {model}, platform: {platform}, input: {input}, output: 1, cache_write: 1, cache_read: 1, source: x }}\n"
        )
    };
    let error = Catalogue::parse(&format!("{head}{}", entry("m", "anthropic", "-1"))).unwrap_err();
    assert!(error.contains("m: input"), "{error}");
    let error = Catalogue::parse(&format!("{head}{}", entry("m", "gemini", "1"))).unwrap_err();
    assert!(error.contains("unknown platform"), "{error}");
    let twice = format!(
        "{head}{}{}",
        entry("m", "openai", "1"),
        entry("m", "openai", "2")
    );
    assert!(
        Catalogue::parse(&twice)
            .unwrap_err()
            .contains("listed twice")
    );
}
