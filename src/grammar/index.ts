export { type ConstraintKind, type ConstraintSpec, ConstraintError, checkConstraint, checkSchema, constraintHash } from "./constraint.ts";
export { type CompiledConstraint, type GrammarVocab, ConstraintCompiler, compilerFor } from "./grammar-compiler.ts";
export { TokenMatcher } from "./token-matcher.ts";
