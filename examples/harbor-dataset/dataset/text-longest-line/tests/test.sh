#!/bin/bash
# Finds the longest line of a text file
expected=5
answer=$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)
answered=0; [ -n "$answer" ] && answered=1
reward=0; [ "$answer" = "$expected" ] && reward=1
echo "expected $expected, got '$answer'"
printf '{"reward": %s, "answered": %s}\n' "$reward" "$answered" > /logs/verifier/reward.json
