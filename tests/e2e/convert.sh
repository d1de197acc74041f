#!/usr/bin/env bash
# End-to-end checks of tandem-convert (llama2.c .bin → GGUF) and tandem-quantize (GGUF → GGUF): the f32
# conversion generates exactly what llama.cpp's stories260K.gguf does, the quantized files run, bad inputs fail
# cleanly without leaving files. Also measures (prints, asserts only loosely) how long greedy decoding with q8_0 /
# q4_0 weights agrees with f32, per prompt of stories260K-greedy.txt.
# Usage: convert.sh BUILD_DIR DATA_DIR
set -euo pipefail
build=$1 data=$2
tandem="$build/tandem" convert="$build/tandem-convert" quantize="$build/tandem-quantize"
tok="$data/tok512.model"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.bash"

gen() {  # gen MODEL PROMPT N: greedy continuation on stdout (one thread: the model is tiny, the runs many)
  "$tandem" -m "$1" -p "$2" -n "$3" --temp 0 -t 1 2>/dev/null
}

# ---- conversions ----------------------------------------------------------------------------------------------
for type in f32 f16 q8_0 q4_0; do
  if "$convert" --tokenizer "$tok" --type "$type" "$data/stories260K.bin" "$tmp/conv_$type.gguf" 2>"$tmp/err"; then
    ok
  else
    bad "convert stories260K.bin to $type: $(cat "$tmp/err")"
  fi
done
check "q8_0 conversion reports the f16 fallback of ffn_down" grep -q "fell back to f16.*ffn_down" "$tmp/err"
"$convert" --tokenizer "$tok" --type q8_0 "$data/stories260K_q80.bin" "$tmp/q80_q8_0.gguf" 2>/dev/null &&
  ok || bad "convert stories260K_q80.bin to q8_0"
"$convert" --tokenizer "$tok" "$data/stories260K_q80.bin" "$tmp/q80_f32.gguf" 2>/dev/null &&
  ok || bad "convert stories260K_q80.bin to f32"
for type in f16 q8_0 q4_0; do
  "$quantize" "$data/stories260K.gguf" "$tmp/rq_$type.gguf" "$type" 2>"$tmp/err" && ok || bad "quantize to $type"
  check "quantize $type prints a size summary" grep -q "tensor data:" "$tmp/err"
done

# ---- the f32 conversion is the same model as llama.cpp's conversion --------------------------------------------
ref=$(gen "$data/stories260K.gguf" "Once upon a time" 100)
mine=$(gen "$tmp/conv_f32.gguf" "Once upon a time" 100)
check "f32 conversion generates exactly what stories260K.gguf does" [ "$mine" = "$ref" ]
check "the reference generation is not empty" [ -n "$ref" ]
while IFS= read -r line; do  # and for every prompt of the reference file, 200 tokens each
  prompt=${line#prompt: }
  check "f32 conversion = stories260K.gguf for \"$prompt\"" \
    [ "$(gen "$tmp/conv_f32.gguf" "$prompt" 200)" = "$(gen "$data/stories260K.gguf" "$prompt" 200)" ]
done < <(grep '^prompt: ' "$data/stories260K-greedy.txt")

# ---- every converted / quantized file runs and produces text ----------------------------------------------------
for m in conv_f16 conv_q8_0 conv_q4_0 q80_q8_0 q80_f32 rq_f16 rq_q8_0 rq_q4_0; do
  out=$(gen "$tmp/$m.gguf" "Once upon a time" 40) || { bad "$m does not run"; continue; }
  check "$m produces text" [ ${#out} -gt 20 ]
done
# Converting straight to a type and converting to f32 then quantizing give the same file, byte for byte (same
# quantizer, same metadata order: file_type in place, quantization_version appended).
for type in f16 q8_0 q4_0; do
  "$quantize" "$tmp/conv_f32.gguf" "$tmp/conv_f32_rq_$type.gguf" $type 2>/dev/null || bad "quantize conv_f32 to $type"
  check "convert --type $type = convert + quantize $type" cmp -s "$tmp/conv_$type.gguf" "$tmp/conv_f32_rq_$type.gguf"
done

# ---- bad inputs: non-zero exit, a message on stderr, no output file (nor a temporary one) ----------------------
expect_failure() {  # expect_failure WHAT OUTFILE COMMAND...
  local what=$1 outfile=$2; shift 2
  if "$@" >/dev/null 2>"$tmp/err"; then bad "$what: succeeded"; return; fi
  check "$what: message on stderr" [ -s "$tmp/err" ]
  check "$what: no output file" [ ! -e "$outfile" ]
}
head -c 50000 "$data/stories260K.bin" >"$tmp/truncated.bin"
head -c 1000 /dev/urandom >"$tmp/garbage.bin"
expect_failure "convert: missing input" "$tmp/o1.gguf" "$convert" --tokenizer "$tok" "$tmp/nope.bin" "$tmp/o1.gguf"
expect_failure "convert: truncated input" "$tmp/o2.gguf" "$convert" --tokenizer "$tok" "$tmp/truncated.bin" "$tmp/o2.gguf"
expect_failure "convert: garbage input" "$tmp/o3.gguf" "$convert" --tokenizer "$tok" "$tmp/garbage.bin" "$tmp/o3.gguf"
expect_failure "convert: a GGUF as input" "$tmp/o4.gguf" "$convert" --tokenizer "$tok" "$data/stories260K.gguf" "$tmp/o4.gguf"
expect_failure "convert: bad --type" "$tmp/o5.gguf" "$convert" --tokenizer "$tok" --type q4_k "$data/stories260K.bin" "$tmp/o5.gguf"
expect_failure "convert: not a tokenizer" "$tmp/o6.gguf" "$convert" --tokenizer "$tmp/garbage.bin" "$data/stories260K.bin" "$tmp/o6.gguf"
expect_failure "convert: missing --tokenizer" "$tmp/o7.gguf" "$convert" "$data/stories260K.bin" "$tmp/o7.gguf"
expect_failure "quantize: missing input" "$tmp/o8.gguf" "$quantize" "$tmp/nope.gguf" "$tmp/o8.gguf" q8_0
expect_failure "quantize: bad type" "$tmp/o9.gguf" "$quantize" "$data/stories260K.gguf" "$tmp/o9.gguf" q5_1
expect_failure "quantize: not a GGUF" "$tmp/o10.gguf" "$quantize" "$data/stories260K.bin" "$tmp/o10.gguf" q8_0
expect_failure "quantize: unwritable output" "$tmp/no/dir/o11.gguf" "$quantize" "$data/stories260K.gguf" "$tmp/no/dir/o11.gguf" q8_0
check "quantize: the error names the unknown type" grep -q "q5_1" <(
  "$quantize" "$data/stories260K.gguf" "$tmp/o9.gguf" q5_1 2>&1 || true)
check "no temporary files left behind" [ -z "$(find "$tmp" -name '*.tmp.*')" ]

# ---- agreement of greedy decoding with f32 -----------------------------------------------------------------------
# chars: length of the common prefix of the two 200-token texts. tokens: the largest k for which -n k gives the
# same text for both models (the first k greedy tokens agree; found by bisection, as agreement is monotone in k).
common_chars() {  # common_chars FILE_A FILE_B
  local r
  if r=$(cmp "$1" "$2" 2>&1); then wc -c <"$1"; return; fi
  case $r in
    *differ*) r=${r##*byte }; r=${r%%,*}; echo $((r - 1)) ;;
    *EOF*) [ "$(wc -c <"$1")" -lt "$(wc -c <"$2")" ] && wc -c <"$1" || wc -c <"$2" ;;
  esac
}
gen_cached() {  # gen_cached KEY MODEL PROMPT N: gen, remembered (the f32 side recurs across bisections)
  local f="$tmp/cache/$1.$4"
  [ -e "$f" ] || { mkdir -p "$tmp/cache"; gen "$2" "$3" "$4" >"$f"; }
  cat "$f"
}
common_tokens() {  # common_tokens KEY_A MODEL_A MODEL_B PROMPT N
  local key=$1 a=$2 b=$3 p=$4 lo=0 hi=$5 mid
  if [ "$(gen_cached "$key" "$a" "$p" "$hi")" = "$(gen "$b" "$p" "$hi")" ]; then echo "$hi"; return; fi
  while [ $((hi - lo)) -gt 1 ]; do  # invariant: lo tokens agree, hi do not
    mid=$(((lo + hi) / 2))
    if [ "$(gen_cached "$key" "$a" "$p" "$mid")" = "$(gen "$b" "$p" "$mid")" ]; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}
n=200
echo "greedy agreement with f32 (stories260K, -n $n; tokens / characters of the common prefix; all = identical):"
printf '  %-32s %-16s %-16s %-16s %s\n' prompt "convert q8_0" "convert q4_0" "quantize q4_0" "q80.bin as f32"
min_q8=$n i=0
while IFS= read -r line; do
  i=$((i + 1))
  prompt=${line#prompt: }
  gen "$tmp/conv_f32.gguf" "$prompt" $n >"$tmp/f32.txt"
  cells=()
  for m in conv_q8_0 conv_q4_0 rq_q4_0 q80_f32; do
    gen "$tmp/$m.gguf" "$prompt" $n >"$tmp/m.txt"
    t=$(common_tokens "f32_$i" "$tmp/conv_f32.gguf" "$tmp/$m.gguf" "$prompt" $n)
    if [ "$m" = conv_q8_0 ] && [ "$t" -lt "$min_q8" ]; then min_q8=$t; fi
    c=$(common_chars "$tmp/f32.txt" "$tmp/m.txt")
    [ "$t" -eq "$n" ] && t="all"  # the whole output agrees (it may end at EOS before n tokens)
    cells+=("$t / $c")
  done
  printf '  %-32s %-16s %-16s %-16s %s\n' "\"$prompt\"" "${cells[@]}"
done < <(grep '^prompt: ' "$data/stories260K-greedy.txt")
check "q8_0 agrees with f32 for at least 1 token on every prompt" [ "$min_q8" -ge 1 ]

echo "convert.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
