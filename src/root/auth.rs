//! Bearer tokens: the admin token and the sync tokens (see
//! [`super::credentials`] for who may sync as whom).

use std::fmt;
use std::path::Path;

/// A secret a client presents as `Authorization: Bearer <token>`.
///
/// Compared in constant time; `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Box<[u8]>);

/// Why a token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file holds no token, or one with bytes a header cannot carry.
    #[error("{0}")]
    Invalid(&'static str),
}

impl Token {
    /// A token from text; surrounding whitespace (a trailing newline) is
    /// dropped.
    pub fn new(text: &str) -> Result<Self, TokenError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(TokenError::Invalid("the token is empty"));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Invalid(
                "the token has bytes other than printable ASCII",
            ));
        }
        Ok(Self(text.as_bytes().into()))
    }

    /// Reads a token file (its whole content, trimmed).
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        Self::new(&std::fs::read_to_string(path)?)
    }

    /// The token text, for clients that send it.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// True when an `Authorization` header value carries this token.
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let Some(presented) = bearer(value) else {
            return false;
        };
        self.matches(presented)
    }

    /// True when `presented` (a bearer token's bytes) is this token.
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(presented, &self.0)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(rest.trim_ascii())
}

/// Compares without an early exit, so timing does not tell how many
/// leading bytes of a guess were right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_match_exactly() {
        let t = Token::new("s3cret\n").unwrap();
        assert!(t.admits(Some(b"Bearer s3cret")));
        assert!(t.admits(Some(b"bearer s3cret")));
        assert!(!t.admits(Some(b"Bearer s3cre")));
        assert!(!t.admits(Some(b"Bearer s3cretX")));
        assert!(!t.admits(Some(b"Basic s3cret")));
        assert!(!t.admits(Some(b"Bear")));
        assert!(!t.admits(None));
    }

    #[test]
    fn empty_and_binary_tokens_are_refused() {
        assert!(Token::new(" \n").is_err());
        assert!(Token::new("a b").is_err());
        assert_eq!(
            format!("{:?}", Token::new("x").unwrap()),
            "Token(<redacted>)"
        );
    }
}
