use super::gbnf_to_lark;

#[test]
fn gbnf_rules_become_lark_rules() {
    let g = r#"
# a yes/no answer, then a count
root ::= answer " " count-word
answer ::= "yes" | "no"
count-word ::= [0-9]{1,3} ("." [0-9]+)?
"#;
    let lark = gbnf_to_lark(g).unwrap();
    assert_eq!(
        lark,
        "start: answer \" \" count_word\nanswer: \"yes\" | \"no\"\n\
         count_word: /[0-9]/ {1,3} ( \".\" /[0-9]/ + ) ?\n"
    );
}

#[test]
fn gbnf_escapes_and_any_char() {
    let lark = gbnf_to_lark("root ::= \"a\\n\\x41\\\"\" [^/\\]] . ").unwrap();
    assert_eq!(lark, "start: \"a\\nA\\\"\" /[^\\/\\]]/ /(?s:.)/\n");
}

#[test]
fn gbnf_errors_name_the_problem() {
    assert!(gbnf_to_lark("answer ::= \"x\"")
        .unwrap_err()
        .contains("root"));
    assert!(gbnf_to_lark("root ::= \"x")
        .unwrap_err()
        .contains("unterminated"));
    assert!(gbnf_to_lark("root \"x\"").unwrap_err().contains("::="));
    assert!(gbnf_to_lark("root ::= [a-").unwrap_err().contains("class"));
}
