#!/bin/bash
ls -S /app/files | head -1 > /app/answer.txt
