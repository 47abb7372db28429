#!/bin/bash
awk -F, 'NR>1 {t[$2]+=$3} END {for (c in t) print t[c], c}' /app/sales.csv | sort -n | tail -1 | cut -d' ' -f2 > /app/answer.txt
