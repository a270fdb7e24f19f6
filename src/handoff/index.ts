export { prefillAndPush, type Handoff, type PrefillPushContext } from "./prefill-and-push.ts";
export { claimForResume, ResumeError } from "./claim-for-resume.ts";
export { FAILED_SIDE_HEADER, failedSideOf, HandoffError } from "./handoff-error.ts";
export { releaseUnclaimed } from "./release.ts";
