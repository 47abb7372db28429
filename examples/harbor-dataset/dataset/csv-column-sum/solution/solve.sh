#!/bin/bash
awk -F, 'NR > 1 { s += $3 } END { print s }' /app/data.csv > /app/answer.txt
