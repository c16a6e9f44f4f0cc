#!/usr/bin/awk -f
# Generates the demo's data set: a parity task ("Is 4731 even or odd?" ->
# "odd") in the seed-003 record formats, deterministic for a given seed.
#
#   awk -v seed=1 -v out=DIR [-v n_instruct=N -v n_conv=N -v n_pretrain=N -v n_heldout=N] \
#       -f scripts/demo_data.awk
#
# Writes
#   DIR/corpus.json    a JSON array of pretrain, instruct and conversation records
#   DIR/tokenizer.txt  the same text (instruct records rendered with the Alpaca
#                      template), one paragraph per record, to learn a tokenizer from
#   DIR/heldout.tsv    NUMBER<TAB>ANSWER for the evaluation prompts; these numbers
#                      appear nowhere in corpus.json or tokenizer.txt
#
# Numbers are 10..9999. The held-out set is n_heldout numbers drawn first,
# half even and half odd, so chance (and the majority answer) is 50%.
function pick(   x) { # a training number: never a held-out one
    do x = 10 + int(rand() * 9990); while (x in held)
    return x
}
function parity(x) { return x % 2 ? "odd" : "even" }
function esc(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\n/, "\\n", s); return s }
function rec(s) { printf "%s%s", (nrec++ ? ",\n" : "[\n"), s > corpus }
function para(s) { print s "\n" > tok }
BEGIN {
    if (out == "") { print "demo_data.awk: -v out=DIR is required" > "/dev/stderr"; exit 2 }
    if (seed == "") seed = 1
    if (n_instruct == "") n_instruct = 3000
    if (n_conv == "") n_conv = 300
    if (n_pretrain == "") n_pretrain = 300
    if (n_heldout == "") n_heldout = 100
    srand(seed)
    corpus = out "/corpus.json"; tok = out "/tokenizer.txt"; heldf = out "/heldout.tsv"
    printf "" > corpus; printf "" > tok; printf "" > heldf

    # held-out numbers: half even, half odd
    for (k = 0; k < n_heldout; k++) {
        do x = 10 + int(rand() * 9990); while ((x in held) || x % 2 != k % 2)
        held[x] = 1
        print x "\t" parity(x) > heldf
    }

    hdr  = "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n### Instruction:\n"
    hdri = "Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
    ask[0] = "Is %d even or odd?"; ask[1] = "Is the number %d odd or even?"; ask[2] = "Tell me whether %d is even or odd."
    word[0] = "zero"; word[1] = "one"; word[2] = "two"; word[3] = "three"; word[4] = "four"
    word[5] = "five"; word[6] = "six"; word[7] = "seven"; word[8] = "eight"; word[9] = "nine"

    # pretrain: short paragraphs about numbers and their last digit
    for (i = 0; i < n_pretrain; i++) {
        t = ""
        for (j = 0; j < 3; j++) {
            x = pick(); d = x % 10
            r = int(rand() * 3)
            if (r == 0) s = sprintf("%d is an %s number.", x, parity(x))
            else if (r == 1) s = sprintf("The last digit of %d is %s, so %d is %s.", x, word[d], x, parity(x))
            else s = sprintf("%d ends in %d. A number that ends in %d is %s.", x, d, d, parity(x))
            t = t (j ? " " : "") s
        }
        rec(sprintf("{\"type\": \"pretrain\", \"text\": \"%s\"}", esc(t)))
        para(t)
    }
    # instruct: the task itself; one in four puts the number in "input"
    for (i = 0; i < n_instruct; i++) {
        x = pick()
        if (rand() < 0.25) {
            q = "Is this number even or odd?"
            rec(sprintf("{\"type\": \"instruct\", \"instruct\": \"%s\", \"input\": \"%d\", \"output\": \"%s\"}", q, x, parity(x)))
            para(hdri q "\n\n### Input:\n" x "\n\n### Response:\n" parity(x))
        } else {
            q = sprintf(ask[int(rand() * 3)], x)
            rec(sprintf("{\"type\": \"instruct\", \"instruct\": \"%s\", \"output\": \"%s\"}", q, parity(x)))
            para(hdr q "\n\n### Response:\n" parity(x))
        }
    }
    # conversation: two or three questions in a row
    for (i = 0; i < n_conv; i++) {
        r = ""; t = ""; m = 2 + int(rand() * 2)
        for (j = 0; j < m; j++) {
            x = pick()
            q = j ? sprintf("And %d?", x) : sprintf(ask[0], x)
            r = r (j ? ", " : "") sprintf("[\"ask\", \"%s\"], [\"ans\", \"%s\"]", q, parity(x))
            t = t "### Human:\n" q "\n\n### Assistant:\n" parity(x) "\n\n"
        }
        rec(sprintf("{\"type\": \"conversation\", \"rounds\": [%s]}", r))
        para(t)
    }
    print "\n]" > corpus
}
