#!/bin/bash
wc -w < /app/poem.txt > /app/answer.txt
