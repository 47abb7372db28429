#!/bin/bash
awk '{ if (length($0) > m) { m = length($0); n = NR } } END { print n }' /app/notes.txt > /app/answer.txt
