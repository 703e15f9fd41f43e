//! The price catalogue shipped with the build (`select/prices/catalogue.yaml`, embedded) and the
//! one rule that prices a model in both modes (docs/DESIGN.md §6, "Prices"): the operator's
//! price, else the catalogue's, else — by the operator's [`UnpricedPolicy`] — the highest
//! catalogue price of the model's family (of its platform when it has none), or no price.

use std::collections::HashMap;
use std::sync::LazyLock;

use poolgate_core::account::{Platform, Price};
use poolgate_core::price::{ModelPrice, PriceSource, UnpricedPolicy};
use serde::Deserialize;

/// The catalogue file, as shipped.
pub const CATALOGUE_YAML: &str = include_str!("../prices/catalogue.yaml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogueFile {
    as_of: String,
    models: Vec<CatalogueEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogueEntry {
    model: String,
    #[serde(default)]
    aliases: Vec<String>,
    platform: String,
    input: f64,
    output: f64,
    cache_write: f64,
    cache_read: f64,
    /// Rerank: USD per search unit.
    #[serde(default)]
    search_unit: f64,
    #[allow(dead_code)]
    source: String,
}

/// One model of the catalogue.
#[derive(Debug, Clone, PartialEq)]
pub struct CataloguePrice {
    pub model: String,
    pub aliases: Vec<String>,
    pub platform: Platform,
    pub price: Price,
}

/// The shipped catalogue: its models by id and alias, and each family's and platform's highest
/// price (per component: never below any of its models).
#[derive(Debug)]
pub struct Catalogue {
    as_of: String,
    models: Vec<CataloguePrice>,
    by_id: HashMap<String, usize>,
    family_max: HashMap<String, Price>,
    platform_max: HashMap<&'static str, Price>,
}

impl Catalogue {
    /// Reads a catalogue file; an entry that is not a price or names an unknown platform, or an
    /// id given twice, is an error naming it.
    pub fn parse(yaml: &str) -> Result<Catalogue, String> {
        let file: CatalogueFile =
            serde_yaml_ng::from_str(yaml).map_err(|e| format!("price catalogue: {e}"))?;
        let mut catalogue = Catalogue {
            as_of: file.as_of,
            models: Vec::with_capacity(file.models.len()),
            by_id: HashMap::new(),
            family_max: HashMap::new(),
            platform_max: HashMap::new(),
        };
        for entry in file.models {
            let platform = Platform::parse(&entry.platform).ok_or_else(|| {
                format!(
                    "price catalogue: {}: unknown platform {:?}",
                    entry.model, entry.platform
                )
            })?;
            let price = Price {
                per_search_unit: entry.search_unit,
                input_per_mtok: entry.input,
                output_per_mtok: entry.output,
                cache_write_per_mtok: entry.cache_write,
                cache_read_per_mtok: entry.cache_read,
            };
            poolgate_core::price::check_price(&entry.model, &price).map_err(
                |(field, problem)| format!("price catalogue: {}: {field}: {problem}", entry.model),
            )?;
            let index = catalogue.models.len();
            for id in std::iter::once(&entry.model).chain(&entry.aliases) {
                if catalogue.by_id.insert(id.clone(), index).is_some() {
                    return Err(format!("price catalogue: {id} is listed twice"));
                }
            }
            if let Some(family) = family(&entry.model) {
                raise(catalogue.family_max.entry(family).or_default(), &price);
            }
            raise(
                catalogue.platform_max.entry(platform.as_str()).or_default(),
                &price,
            );
            catalogue.models.push(CataloguePrice {
                model: entry.model,
                aliases: entry.aliases,
                platform,
                price,
            });
        }
        Ok(catalogue)
    }

    /// The day its prices were read from the providers.
    pub fn as_of(&self) -> &str {
        &self.as_of
    }

    /// Every model, in the file's order.
    pub fn models(&self) -> &[CataloguePrice] {
        &self.models
    }

    /// A model's catalogue price, by id or alias.
    pub fn get(&self, model: &str) -> Option<&CataloguePrice> {
        self.by_id.get(model).map(|&index| &self.models[index])
    }

    /// The fallback for a model the catalogue does not have: its family's highest price, else
    /// its platform's; `None` only for a platform the catalogue has no model of.
    pub fn fallback(&self, model: &str, platform: Platform) -> Option<ModelPrice> {
        if let Some(family) = family(model)
            && let Some(price) = self.family_max.get(&family)
        {
            return Some(ModelPrice::fallback(*price, format!("{family}*")));
        }
        self.platform_max
            .get(platform.as_str())
            .map(|price| ModelPrice::fallback(*price, format!("{}:*", platform.as_str())))
    }
}

/// Raises each component of `max` to `price`'s where it is higher.
fn raise(max: &mut Price, price: &Price) {
    max.input_per_mtok = max.input_per_mtok.max(price.input_per_mtok);
    max.output_per_mtok = max.output_per_mtok.max(price.output_per_mtok);
    max.cache_write_per_mtok = max.cache_write_per_mtok.max(price.cache_write_per_mtok);
    max.cache_read_per_mtok = max.cache_read_per_mtok.max(price.cache_read_per_mtok);
    max.per_search_unit = max.per_search_unit.max(price.per_search_unit);
}

/// The Claude families, as the model id's `-`-separated parts name them.
const CLAUDE_FAMILIES: [&str; 5] = ["opus", "sonnet", "haiku", "fable", "mythos"];

/// A model's family, as a prefix its fallback names with `*` (docs/DESIGN.md §6, "Prices"):
/// - `claude-<family>-`: an id starting `claude-` one of whose `-`-separated parts is `opus`,
///   `sonnet`, `haiku`, `fable` or `mythos` (the first such part; `claude-3-7-sonnet-…` is
///   `claude-sonnet-`);
/// - `gpt-<N>`: an id starting `gpt-` and a major version `N` (digits) followed by `.`, `-` or
///   the end; `gpt-<N>…-pro` (last part `pro`) is a family of its own, `gpt-<N>-pro`;
/// - `o<N>`: `o`, digits, then `-` or the end (`o3`, `o3-pro` is `o3-pro`);
/// - `text-embedding-`: OpenAI's embedding models (an unknown one is charged the highest
///   embedding price, never a chat model's);
/// - anything else has none.
pub fn family(model: &str) -> Option<String> {
    if model.starts_with("text-embedding-") {
        return Some("text-embedding-".to_owned());
    }
    if let Some(rest) = model.strip_prefix("claude-") {
        return rest
            .split('-')
            .find(|part| CLAUDE_FAMILIES.contains(part))
            .map(|family| format!("claude-{family}-"));
    }
    let pro = model.ends_with("-pro");
    if let Some(rest) = model.strip_prefix("gpt-") {
        let major: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = rest[major.len()..].chars().next();
        if major.is_empty() || !matches!(after, None | Some('.') | Some('-')) {
            return None;
        }
        return Some(if pro {
            format!("gpt-{major}-pro")
        } else {
            format!("gpt-{major}")
        });
    }
    if let Some(rest) = model.strip_prefix('o') {
        let major: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = rest[major.len()..].chars().next();
        if major.is_empty() || !matches!(after, None | Some('-')) {
            return None;
        }
        return Some(if pro {
            format!("o{major}-pro")
        } else {
            format!("o{major}")
        });
    }
    None
}

/// The shipped catalogue, read once. The file is part of the build: a parse failure is a
/// programming error every test catches (`the_shipped_catalogue_reads_and_covers_the_pinned_clis_models`).
pub fn catalogue() -> &'static Catalogue {
    static CATALOGUE: LazyLock<Catalogue> = LazyLock::new(|| {
        Catalogue::parse(CATALOGUE_YAML).expect("the shipped price catalogue reads")
    });
    &CATALOGUE
}

/// A model's price in both modes: the operator's (`operator`, by model id), else the
/// catalogue's, else as `policy` says.
pub fn price_of(
    operator: &HashMap<String, Price>,
    model: &str,
    platform: Platform,
    policy: UnpricedPolicy,
) -> ModelPrice {
    price_in(catalogue(), operator, model, platform, policy)
}

/// [`price_of`] over a given catalogue.
pub fn price_in(
    catalogue: &Catalogue,
    operator: &HashMap<String, Price>,
    model: &str,
    platform: Platform,
    policy: UnpricedPolicy,
) -> ModelPrice {
    if let Some(price) = operator.get(model) {
        return ModelPrice::new(*price, PriceSource::Operator);
    }
    if let Some(entry) = catalogue.get(model) {
        return ModelPrice::new(entry.price, PriceSource::Catalogue);
    }
    match policy {
        UnpricedPolicy::Refuse => ModelPrice::refused(),
        UnpricedPolicy::Fallback => catalogue
            .fallback(model, platform)
            .unwrap_or_else(ModelPrice::none),
    }
}

#[cfg(test)]
mod tests;
