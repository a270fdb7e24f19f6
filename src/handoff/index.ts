export { prefillAndPush, type Handoff, type PrefillPushContext, type PrefillPushRequest } from "./prefill-and-push.ts";
export { claimForResume, ResumeError } from "./claim-for-resume.ts";
export { FAILED_SIDE_HEADER, failedSideOf, HandoffError, type FailedSide } from "./handoff-error.ts";
export { releaseUnclaimed, type HandleReleaser } from "./release.ts";
