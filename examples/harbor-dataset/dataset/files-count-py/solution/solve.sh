#!/bin/bash
find /app/project -name '*.py' -type f | wc -l > /app/answer.txt
