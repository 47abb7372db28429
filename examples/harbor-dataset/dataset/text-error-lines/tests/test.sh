#!/bin/bash
# Counts the ERROR lines of a log
expected=8
answer=$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)
answered=0; [ -n "$answer" ] && answered=1
reward=0; [ "$answer" = "$expected" ] && reward=1
echo "expected $expected, got '$answer'"
printf '{"reward": %s, "answered": %s}\n' "$reward" "$answered" > /logs/verifier/reward.json
