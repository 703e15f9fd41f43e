//! Which price a model's usage is charged at and where it came from (docs/DESIGN.md §6,
//! "Prices"): an operator's price, the shipped catalogue's, a family fallback, or none. "No
//! price" is a state of its own, never a price of $0.

use crate::account::Price;

/// Where the price a request was charged at came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PriceSource {
    /// Set by the operator (the standalone YAML or state file, Postgres' `model_prices`).
    Operator,
    /// The catalogue shipped with the build (`select/prices/catalogue.yaml`).
    Catalogue,
    /// Neither had the model: the highest catalogue price of its family (or of its platform),
    /// as [`ModelPrice::fallback_from`] names.
    Fallback,
    /// No price at all (the operator refuses unpriced models, or an older selector sent none):
    /// charged $0; refused to a key with a budget where the operator refuses unpriced models
    /// ([`ModelPrice::refuse_budgeted`]).
    None,
}

impl PriceSource {
    /// Stable lowercase name: the usage ledger, the operator's rows, metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            PriceSource::Operator => "operator",
            PriceSource::Catalogue => "catalogue",
            PriceSource::Fallback => "fallback",
            PriceSource::None => "none",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            PriceSource::Operator,
            PriceSource::Catalogue,
            PriceSource::Fallback,
            PriceSource::None,
        ]
        .into_iter()
        .find(|source| source.as_str() == text)
    }
}

/// The price a model is charged at, with its provenance.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPrice {
    /// All zeros when `source` is [`PriceSource::None`].
    pub price: Price,
    pub source: PriceSource,
    /// For a fallback: the family (`claude-opus-*`) or platform (`openai:*`) whose highest
    /// price applied; empty otherwise.
    pub fallback_from: String,
    /// No price because the operator refuses unpriced models (`UnpricedPolicy::Refuse`): a key
    /// with a budget is refused the model. `false` for a price an older selector did not state
    /// (served at $0 as it always was: refusing is the operator's choice, which an older
    /// selector cannot make).
    pub refuse_budgeted: bool,
}

impl ModelPrice {
    /// No price known (an older selector's plan said none): charged $0, refused to no one.
    pub fn none() -> Self {
        ModelPrice {
            price: Price::default(),
            source: PriceSource::None,
            fallback_from: String::new(),
            refuse_budgeted: false,
        }
    }

    /// No price, and the operator refuses unpriced models: refused to a key with a budget.
    pub fn refused() -> Self {
        ModelPrice {
            refuse_budgeted: true,
            ..ModelPrice::none()
        }
    }

    pub fn new(price: Price, source: PriceSource) -> Self {
        ModelPrice {
            price,
            source,
            fallback_from: String::new(),
            refuse_budgeted: false,
        }
    }

    /// A fallback: `price` is the highest catalogue price of `from` (a family or a platform).
    pub fn fallback(price: Price, from: String) -> Self {
        ModelPrice {
            fallback_from: from,
            ..ModelPrice::new(price, PriceSource::Fallback)
        }
    }

    /// What a selector that sends no provenance (an older one) meant: a price of all zeros was
    /// "no price known", anything else the operator's.
    pub fn legacy(price: Price) -> Self {
        if price == Price::default() {
            ModelPrice::none()
        } else {
            ModelPrice::new(price, PriceSource::Operator)
        }
    }

    /// Whether usage at this price is charged by a price someone stated (operator or
    /// catalogue), not by a fallback or nothing.
    pub fn is_stated(&self) -> bool {
        matches!(self.source, PriceSource::Operator | PriceSource::Catalogue)
    }
}

impl Default for ModelPrice {
    fn default() -> Self {
        ModelPrice::none()
    }
}

/// A model's price as the operator's listing shows it (`prices`, `set-price`, `remove-price`).
#[derive(Debug, Clone, PartialEq)]
pub struct ListedPrice {
    pub model: String,
    /// `None` for [`PriceSource::None`].
    pub price: Option<Price>,
    /// [`PriceSource::Operator`], [`PriceSource::Catalogue`], or [`PriceSource::None`] (a model
    /// neither prices: a removal's answer).
    pub source: PriceSource,
    /// An operator's price over a model the catalogue also prices: the catalogue's, which
    /// applies again when the operator's is removed.
    pub catalogue: Option<Price>,
}

/// What a model with neither an operator's nor a catalogue price is charged at
/// (docs/DESIGN.md §6, "Prices").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnpricedPolicy {
    /// The highest catalogue price of its family, or of its platform without one (default).
    #[default]
    Fallback,
    /// No price: a key with a budget is refused the model (4xx naming it); a key without one
    /// is served at $0, counted in `relay_unpriced_usage_total{pricing="none"}`.
    Refuse,
}

impl UnpricedPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            UnpricedPolicy::Fallback => "fallback",
            UnpricedPolicy::Refuse => "refuse",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fallback" => Some(UnpricedPolicy::Fallback),
            "refuse" => Some(UnpricedPolicy::Refuse),
            _ => None,
        }
    }
}

/// Why a price cannot be set: the field named (negative, NaN, infinite, above 1e6 USD per
/// million tokens, or an empty or invalid model name).
pub fn check_price(model: &str, price: &Price) -> Result<(), (&'static str, String)> {
    if model.is_empty() {
        return Err(("model", "must not be empty".into()));
    }
    if model.len() > crate::MAX_NAME_BYTES {
        return Err((
            "model",
            format!("longer than {} bytes", crate::MAX_NAME_BYTES),
        ));
    }
    if let Some(bad) = model
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-._:/@+".contains(*c)))
    {
        return Err(("model", format!("the character {bad:?} is not allowed")));
    }
    for (field, value) in [
        ("input", price.input_per_mtok),
        ("output", price.output_per_mtok),
        ("cache_write", price.cache_write_per_mtok),
        ("cache_read", price.cache_read_per_mtok),
        ("search_unit", price.per_search_unit),
    ] {
        if !value.is_finite() || !(0.0..=MAX_PRICE_PER_MTOK).contains(&value) {
            return Err((
                field,
                format!(
                    "{value} is not a price (0 to {MAX_PRICE_PER_MTOK} USD per million tokens)"
                ),
            ));
        }
    }
    Ok(())
}

/// The highest price per million tokens an operator may set.
pub const MAX_PRICE_PER_MTOK: f64 = 1_000_000.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_selectors_zero_price_is_no_price_and_any_other_the_operators() {
        assert_eq!(
            ModelPrice::legacy(Price::default()).source,
            PriceSource::None
        );
        let price = Price {
            input_per_mtok: 1.0,
            ..Price::default()
        };
        assert_eq!(ModelPrice::legacy(price).source, PriceSource::Operator);
    }

    #[test]
    fn a_price_is_refused_naming_its_field() {
        let good = Price {
            per_search_unit: 0.0,
            input_per_mtok: 3.0,
            output_per_mtok: 15.0,
            cache_write_per_mtok: 3.75,
            cache_read_per_mtok: 0.3,
        };
        assert!(check_price("claude-sonnet-4-6", &good).is_ok());
        assert!(
            check_price("claude-sonnet-4-6", &Price::default()).is_ok(),
            "free is a price"
        );
        assert_eq!(check_price("", &good).unwrap_err().0, "model");
        assert_eq!(check_price("a b", &good).unwrap_err().0, "model");
        for (field, price) in [
            (
                "input",
                Price {
                    input_per_mtok: -1.0,
                    ..good
                },
            ),
            (
                "output",
                Price {
                    output_per_mtok: f64::NAN,
                    ..good
                },
            ),
            (
                "cache_write",
                Price {
                    cache_write_per_mtok: f64::INFINITY,
                    ..good
                },
            ),
            (
                "cache_read",
                Price {
                    cache_read_per_mtok: 2e6,
                    ..good
                },
            ),
        ] {
            assert_eq!(check_price("m", &price).unwrap_err().0, field);
        }
    }

    #[test]
    fn names_round_trip() {
        for source in [
            PriceSource::Operator,
            PriceSource::Catalogue,
            PriceSource::Fallback,
            PriceSource::None,
        ] {
            assert_eq!(PriceSource::parse(source.as_str()), Some(source));
        }
        for policy in [UnpricedPolicy::Fallback, UnpricedPolicy::Refuse] {
            assert_eq!(UnpricedPolicy::parse(policy.as_str()), Some(policy));
        }
    }
}
