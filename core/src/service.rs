//! What an account serves (docs/DESIGN.md §6, "Embeddings and rerank"): the relay's kinds of
//! request, and which of them an account of a platform and credential may be set to serve
//! ([`Platform::can_serve`] says what each can at most).

use crate::account::{CredentialKind, Platform};

/// What an account's upstream answers, by the relay's paths (docs/DESIGN.md §6, "Embeddings and
/// rerank"): chat (Messages, chat completions, Responses, count_tokens), `/v1/embeddings`,
/// `/v1/rerank` and `/v2/rerank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Service {
    #[default]
    Chat,
    Embeddings,
    Rerank,
}

impl Service {
    pub const ALL: [Service; 3] = [Service::Chat, Service::Embeddings, Service::Rerank];

    /// The name operators write in an account's `serves` list.
    pub fn as_str(self) -> &'static str {
        match self {
            Service::Chat => "chat",
            Service::Embeddings => "embeddings",
            Service::Rerank => "rerank",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Service::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// Why an account's `serves` list cannot be stored, naming the service; `None`: it can.
pub fn serves_problem(
    platform: Platform,
    kind: CredentialKind,
    serves: &[Service],
) -> Option<String> {
    serves
        .iter()
        .find(|s| !platform.can_serve(kind, **s))
        .map(|s| {
            format!(
                "a {} account ({}) cannot serve {}",
                platform.as_str(),
                kind.as_str(),
                s.as_str()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serves_list_names_only_what_the_platform_can() {
        use CredentialKind::*;
        assert_eq!(
            serves_problem(Platform::OpenAi, ApiKey, &[Service::Embeddings]),
            None
        );
        assert!(serves_problem(Platform::Anthropic, ApiKey, &[Service::Embeddings]).is_some());
        assert!(serves_problem(Platform::OpenAi, ChatGptOAuth, &[Service::Embeddings]).is_some());
        assert!(serves_problem(Platform::Rerank, ApiKey, &[Service::Chat]).is_some());
        assert!(serves_problem(Platform::Rerank, OAuth, &[Service::Rerank]).is_some());
        let problem = serves_problem(Platform::OpenAi, ApiKey, &[Service::Rerank]);
        assert!(problem.is_some_and(|p| p.contains("rerank") && p.contains("openai")));
        for service in Service::ALL {
            assert_eq!(Service::parse(service.as_str()), Some(service));
        }
        assert_eq!(Platform::parse("rerank"), Some(Platform::Rerank));
        assert_eq!(Service::parse("images"), None);
    }
}
