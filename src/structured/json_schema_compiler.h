// JSON Schema -> JsonGrammar, for response_format {"type": "json_schema"}.
//
// Supported (draft 2020-12 names, and the older `definitions`): type (one or a list), enum,
// const, properties, required, additionalProperties, items, minItems, maxItems, minLength,
// maxLength, minimum / maximum / exclusiveMinimum / exclusiveMaximum of integers (bounds
// beyond +-2^31 - 1 are pulled in to it) and of numbers (then written with at most 6 fraction
// digits, no exponent, |x| < 10^9), pattern of strings (regex_dfa.h's syntax, searched
// in the decoded value; not with minLength / maxLength; such strings take no \uXXXX escapes),
// anyOf, oneOf (read as anyOf), allOf with one
// schema, $ref to "#" or a JSON pointer inside the schema ($defs, definitions; recursion
// allowed), and boolean schemas.
// Annotations are ignored: title, description, default, examples, format (an annotation in
// JSON Schema unless a validator opts in), $schema, $id, $comment, deprecated, readOnly,
// writeOnly, discriminator.
//
// What the generated text looks like: object properties appear in the schema's order (the
// request must be parsed order-preserving: ordered_json); optional ones may be left out; no
// property outside `properties` is generated when the object has any (additionalProperties
// then only matters for objects without properties: maps); enum and const values appear in
// compact form (no whitespace). Keywords that restrict values in ways the grammar cannot
// express (multipleOf, uniqueItems, minProperties,
// not, if/then/else, prefixItems, ...) are refused with an error naming the keyword and where
// it is, rather than ignored.
#pragma once
#include <nlohmann/json.hpp>

#include "structured/json_grammar.h"

namespace moeserve::structured {

// Throws moeserve::Error "<JSON pointer>: <what is wrong>" ("(root)" for the top).
JsonGrammar compile_json_schema(const nlohmann::ordered_json& schema);

}  // namespace moeserve::structured
