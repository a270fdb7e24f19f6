export {
  type ConstraintKind,
  type ConstraintSpec,
  CONSTRAINT_BACKEND,
  CONSTRAINT_KINDS,
  CONSTRAINT_LIMITS,
  ConstraintError,
  checkConstraint,
  checkSchema,
  constraintHash,
} from "./constraint.ts";
export { type CompiledConstraint, type GrammarVocab, ConstraintCompiler, compilerFor, GRAMMAR_CACHE_ENTRIES } from "./grammar-compiler.ts";
export { TokenMatcher } from "./token-matcher.ts";
