#!/usr/bin/env bash
# traceguard's CI gate (docs/ci/README.md): take a run bundle (an artifact of a GPU job) or capture
# one with the harness on CPU, run the checks (JUnit + JSON), compare with the main branch's newest
# stored run, and on the main branch keep this run as the next baseline.
#
# Environment (all optional but TG_BRANCH):
#   TG_BRANCH        the branch being built (GitHub: github.head_ref || github.ref_name; GitLab: CI_COMMIT_REF_NAME)
#   TG_MAIN_BRANCH   the branch whose runs are the baseline (main)
#   TG_COMMIT        the commit, kept as a run label
#   TG_BUNDLE        a run bundle directory (captures, NCCL logs, nvidia-smi output); empty: capture on CPU now
#   TG_PROFILE       the checklist profile (default: production for a GPU job's bundle, ci-cpu for the
#                    CPU capture: two gloo ranks sharing the CI machine's cores straggle by construction)
#   TG_OUT           where junit.xml, report.json, compare.md/.json go (traceguard-out)
#   TG_DATA_DIR      the embedded store kept between CI runs (CI cache) (.traceguard-store)
#   TRACEGUARD_SERVER, TRACEGUARD_TOKEN   a traceguard service instead of the embedded store
#   TG_HARNESS_ARGS  extra `traceguard harness run` options for the CPU capture
#   TRACEGUARD       the traceguard command (traceguard)
#
# Exit status: 0 no check fails and none regressed; 1 a check fails or one the base passed got
# worse; 2 unusable input (nothing to check).
set -uo pipefail

tg="${TRACEGUARD:-traceguard}"
branch="${TG_BRANCH:?set TG_BRANCH to the branch being built}"
main="${TG_MAIN_BRANCH:-main}"
commit="${TG_COMMIT:-unknown}"
profile="${TG_PROFILE:-}"
out="${TG_OUT:-traceguard-out}"
bundle="${TG_BUNDLE:-}"
if [ -n "${TRACEGUARD_SERVER:-}" ]; then
  store=()  # --server/--token come from TRACEGUARD_SERVER/TRACEGUARD_TOKEN
else
  store=(--data-dir "${TG_DATA_DIR:-.traceguard-store}")
fi
mkdir -p "$out"

# 1. The bundle: given, or captured now (2 ranks, gloo, torch.profiler) on the CI machine's CPU.
if [ -z "$bundle" ]; then
  bundle="$out/bundle"
  # shellcheck disable=SC2086 # TG_HARNESS_ARGS is a list of options
  "$tg" harness run --world-size 2 --backend gloo --capture torch --model mlp --steps 5 --warmup 1 --timed 0 \
    --out "$bundle" ${TG_HARNESS_ARGS:-} || exit 2
fi

[ -n "$profile" ] || { [ -n "${TG_BUNDLE:-}" ] && profile=production || profile=ci-cpu; }

# 2. The checks: JUnit for the CI's test view, JSON for the comparison.
"$tg" check "$bundle" --profile "$profile" --junit "$out/junit.xml" --json "$out/report.json"
check_status=$?
if [ "$check_status" -ge 2 ]; then
  echo "traceguard: nothing usable in $bundle (exit $check_status)" >&2
  exit "$check_status"
fi

# 3. Compare with the main branch's newest analysed run (the first CSV row after the header).
compare_status=0
base=$("$tg" runs "${store[@]}" --label "branch=$main" --status analysed --limit 1 --format csv | sed -n 2p | cut -d, -f1)
if [ -n "$base" ]; then
  "$tg" compare "run:$base" "$out/report.json" "${store[@]}" --profile "$profile" --format json --out "$out/compare.json"
  compare_status=$?
  "$tg" compare "run:$base" "$out/report.json" "${store[@]}" --profile "$profile" --out "$out/compare.md" || true
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$out/compare.md" >> "$GITHUB_STEP_SUMMARY"
  fi
else
  echo "traceguard: no analysed run of branch $main stored yet: nothing to compare with" | tee "$out/compare.md"
fi

# 4. On the main branch, keep this run as the next baseline.
if [ "$branch" = "$main" ]; then
  if [ -n "${TRACEGUARD_SERVER:-}" ]; then
    "$tg" upload "$bundle" --profile "$profile" --label "branch=$branch" --label "commit=$commit" >/dev/null
  else
    "$tg" record "$bundle" "${store[@]}" --profile "$profile" --label "branch=$branch" --label "commit=$commit" \
      >/dev/null
  fi
  [ $? -ge 2 ] && echo "traceguard: could not store the run" >&2
fi

if [ "$check_status" -ne 0 ] || [ "$compare_status" -ne 0 ]; then
  echo "traceguard: gate failed (check exit $check_status, compare exit $compare_status)" >&2
  exit 1
fi
echo "traceguard: gate passed"
