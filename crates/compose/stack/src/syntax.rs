//! The shape of wrapper specs, `NAME(ARG, ARG, ...)`, without their meaning: where the name
//! ends, which parenthesis closes which, and where the top-level commas split the arguments.

use crate::spec::{redact, SpecError};

/// `NAME(ARG, ...)` taken apart; each argument is trimmed and may itself be a spec with
/// parentheses and commas of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call<'a> {
    pub name: &'a str,
    pub args: Vec<&'a str>,
}

/// The kind word a spec starts with (`mem`, `file`, `cache`, ...) and the character after it.
pub(crate) fn kind(text: &str) -> (&str, Option<char>) {
    let end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).unwrap_or(text.len());
    (&text[..end], text[end..].chars().next())
}

/// Splits `NAME(ARG, ...)`; the caller has checked that `text` starts with a name and `(`.
pub(crate) fn call(text: &str) -> Result<Call<'_>, SpecError> {
    let unbalanced = |at: usize, problem: &'static str| SpecError::Unbalanced { text: redact(text), at, problem };
    let (name, _) = kind(text);
    let open = name.len();
    let mut depth = 0usize;
    let mut args = Vec::new();
    let mut start = open + 1;
    let mut close = None;
    for (i, c) in text.char_indices().skip(open) {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1).ok_or_else(|| unbalanced(i, "')' without a matching '('"))?;
                if depth == 0 {
                    args.push(text[start..i].trim());
                    close = Some(i);
                    break;
                }
            }
            ',' if depth == 1 => {
                args.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let close = close.ok_or_else(|| unbalanced(open, "'(' is never closed"))?;
    if close + 1 != text.len() {
        return Err(SpecError::Trailing { text: redact(text), rest: redact(&text[close + 1..]) });
    }
    Ok(Call { name, args })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_end_at_the_first_other_character() {
        assert_eq!(kind("mem:1G"), ("mem", Some(':')));
        assert_eq!(kind("cache(mem:1G)"), ("cache", Some('(')));
        assert_eq!(kind("iscsi://h/i/0"), ("iscsi", Some(':')));
        assert_eq!(kind("mem"), ("mem", None));
        assert_eq!(kind(""), ("", None));
        assert_eq!(kind("/dev/sda"), ("", Some('/')));
    }

    #[test]
    fn calls_split_at_top_level_commas_only() {
        let c = call("cache(mem:1G, log=/var/l.img, mode=log)").unwrap();
        assert_eq!(c, Call { name: "cache", args: vec!["mem:1G", "log=/var/l.img", "mode=log"] });
        let c = call("a(b(c:1, d=2), e=(x,y))").unwrap();
        assert_eq!(c, Call { name: "a", args: vec!["b(c:1, d=2)", "e=(x,y)"] });
        assert_eq!(call("a()").unwrap(), Call { name: "a", args: vec![""] });
    }

    #[test]
    fn unbalanced_parentheses_say_where() {
        let e = call("cache(mem:1G").unwrap_err();
        assert_eq!(e, SpecError::Unbalanced { text: "cache(mem:1G".into(), at: 5, problem: "'(' is never closed" });
        assert!(e.to_string().contains("never closed"), "{e}");
        let e = call("cache(b(mem:1G)").unwrap_err();
        assert!(matches!(e, SpecError::Unbalanced { at: 5, .. }), "{e}");
        let e = call("cache(mem:1G))").unwrap_err();
        assert_eq!(e, SpecError::Trailing { text: "cache(mem:1G))".into(), rest: ")".into() });
        let e = call("cache(mem:1G) x").unwrap_err();
        assert!(e.to_string().contains("\" x\""), "{e}");
    }
}
