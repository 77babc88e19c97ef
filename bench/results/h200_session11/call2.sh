#!/usr/bin/env bash
# Eleventh session, call 2 (H200, warm after call 1): call 1's step 3 again (its test list
# was glob-expanded by the shell, so the tf32x3 suites did not run), and eight more runs of
# the write-up's line on each binary, interleaved.
set -u
sed -e 's/s11c1/s11c2/g' bench/results/h200_session11/call1.sh > /tmp/call2_body.sh
bash /tmp/call2_body.sh
