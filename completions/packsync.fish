# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_packsync_global_optspecs
    string join \n h/help V/version
end

function __fish_packsync_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_packsync_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_packsync_using_subcommand
    set -l cmd (__fish_packsync_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c packsync -n "__fish_packsync_needs_command" -s h -l help -d 'Print help'
complete -c packsync -n "__fish_packsync_needs_command" -s V -l version -d 'Print version'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "status" -d 'Show what is live and what is retained'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "verify" -d 'Re-hash the live tree against its manifest (exit 4 on differences)'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "rollback" -d 'Make a retained generation live again'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "gc" -d 'Retire old generations and remove dead staging'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "wait" -d 'Block until DEST holds a live generation (exit 5 on timeout)'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "exec" -d 'Run CMD with PACKSYNC_ROOT set to the live generation, leased while it runs'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "completions" -d 'Print a shell completion script'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "sync" -d 'Mirror SOURCE(s) into DEST (later SOURCEs win paths that several provide)'
complete -c packsync -n "__fish_packsync_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c packsync -n "__fish_packsync_using_subcommand status" -l slot -d 'With --layout fanout: only this slot' -r
complete -c packsync -n "__fish_packsync_using_subcommand status" -l json -d 'One JSON object on stdout'
complete -c packsync -n "__fish_packsync_using_subcommand status" -s h -l help -d 'Print help'
complete -c packsync -n "__fish_packsync_using_subcommand verify" -l slot -d 'With --layout fanout: only this slot' -r
complete -c packsync -n "__fish_packsync_using_subcommand verify" -l json -d 'One JSON object on stdout'
complete -c packsync -n "__fish_packsync_using_subcommand verify" -s h -l help -d 'Print help'
complete -c packsync -n "__fish_packsync_using_subcommand rollback" -l to -d 'Generation to publish: a name, a unique prefix or a label (default: the newest one made before the live one)' -r
complete -c packsync -n "__fish_packsync_using_subcommand rollback" -l slot -d 'With --layout fanout: the slot to roll back' -r
complete -c packsync -n "__fish_packsync_using_subcommand rollback" -s h -l help -d 'Print help'
complete -c packsync -n "__fish_packsync_using_subcommand gc" -l keep -d 'Earlier generations to keep besides the live one' -r
complete -c packsync -n "__fish_packsync_using_subcommand gc" -l grace -d 'Keep every generation retired less than DUR ago (e.g. 30s, 10m, 2h)' -r
complete -c packsync -n "__fish_packsync_using_subcommand gc" -s h -l help -d 'Print help'
complete -c packsync -n "__fish_packsync_using_subcommand wait" -l timeout -d 'Give up after this long (e.g. 30s, 5m; default: wait forever)' -r
complete -c packsync -n "__fish_packsync_using_subcommand wait" -l label -d 'Wait for a live generation with exactly this label' -r
complete -c packsync -n "__fish_packsync_using_subcommand wait" -l slot -d 'With --layout fanout: wait for this slot only' -r
complete -c packsync -n "__fish_packsync_using_subcommand wait" -s h -l help -d 'Print help'
complete -c packsync -n "__fish_packsync_using_subcommand exec" -l slot -d 'With --layout fanout: the slot whose generation CMD runs on' -r
complete -c packsync -n "__fish_packsync_using_subcommand exec" -s h -l help -d 'Print help'
complete -c packsync -n "__fish_packsync_using_subcommand completions" -s h -l help -d 'Print help'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l registry-auth -d 'Registry credentials: a Docker config.json (its credHelpers and credsStore run docker-credential-NAME) or a mounted .dockerconfigjson (default: $DOCKER_CONFIG/config.json, then ~/.docker/config.json); read again by each sync' -r -F
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l ca-file -d 'Trust the PEM certificates in FILE too (besides the system\'s and the compiled-in roots)' -r -F
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l insecure-registry -d 'Allow plain HTTP to this registry (repeatable; loopback addresses need no flag)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l header -d 'Send this header with https:// and http:// sources (repeatable), e.g. \'Authorization: Bearer TOKEN\'' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l header-file -d 'Read headers for https:// and http:// sources from FILE, one \'NAME: VALUE\' a line (read again by each sync)' -r -F
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l timeout -d 'Give up on a connection, on headers or a manifest not whole, or on a download with less than 1 KiB, after DUR' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l round-timeout -d 'End the downloads of a sync (each round with --every) after DUR (default: no bound)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l semver -d 'For oci:// and oci-layout: SOURCEs without a tag: publish the highest tag that is a semantic version in RANGE (Flux\'s syntax: \'>=1.4.0 <2.0.0\', \'~1.4\', \'^1.2\', \'1.x\', \'||\'); the sidecar follows new releases' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l tag-filter -d 'With --semver: consider only the tags REGEX matches (anywhere in the tag unless anchored)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l platform -d 'The image of an index to take: OS/ARCH[/VARIANT] (default: the running platform)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l verify-key -d 'Publish only sources signed by this PEM public key (repeatable; ECDSA P-256/P-384, Ed25519, RSA >= 2048): an OPA bundle\'s /.signatures.json; else exit 6' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l trusted-root -d 'For image SOURCEs: verify Sigstore bundles offline against this trusted_root.json: keyless certificates (with --certificate-identity and --certificate-oidc-issuer) and every bundle\'s transparency log entry; else exit 6' -r -F
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l certificate-identity -d 'With --trusted-root: the identity (SAN email or URI) a keyless certificate must name, exactly' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l certificate-oidc-issuer -d 'With --trusted-root: the OIDC issuer a keyless certificate must name, exactly (e.g. https://token.actions.githubusercontent.com)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l layer-media-type -d 'For image SOURCEs: publish only the layers of this media type (repeatable; Flux\'s layerSelector), e.g. an OPA bundle\'s application/vnd.oci.image.layer.v1.tar+gzip' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l exclude -d 'Leave out paths matching GLOB (gitignore syntax; repeatable)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l include -d 'Keep paths matching GLOB even if an earlier --exclude matched them (repeatable)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l exclude-from -d 'Read exclude patterns from FILE (gitignore syntax; repeatable)' -r -F
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l set-mtime -d 'Give every published entry this mtime, seconds since the epoch (e.g. "$SOURCE_DATE_EPOCH"), and compare files by size and content: writers whose sources differ only in mtimes publish one generation' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l chown -d 'Set every owner to UID:GID' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l chmod -d 'Change modes, rsync syntax (e.g. D755,F644 or go-w)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l label -d 'A version label recorded with the generation (refuses downgrades); \'auto\': the content\'s version (an image\'s org.opencontainers.image.version, a bundle\'s .manifest revision)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l max-delete -d 'Refuse (exit 3) to delete more than N entries' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l max-entries -d 'Refuse (exit 1) an archive, bundle or image that holds more than N entries' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l layout -d 'How DEST is laid out' -r -f -a "symlink\t''
fanout\t''
dir\t''"
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l slot -d 'With --layout fanout: publish as this slot (several images, one DEST)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l keep -d 'Earlier generations to keep besides the live one' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l grace -d 'Keep every generation retired less than DUR ago (e.g. 30s, 10m, 2h)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l exec-after -d 'Run CMD (with sh -c) after a new generation goes live' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l every -d 'Keep running: sync again every DUR (and at once on SIGHUP), publishing only what changed' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l max-failures -d 'With --every: exit 1 after N failed rounds in a row (default: keep trying)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l unhealthy-after -d 'With --every: /healthz answers 503 after N failed rounds in a row, until one succeeds (default: 3)' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l http-bind -d 'With --every: serve /healthz, /readyz and /metrics on ADDR:PORT' -r
complete -c packsync -n "__fish_packsync_using_subcommand sync" -s c -l checksum -d 'Compare file content by SHA-256 instead of size and mtime'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -s X -l xattrs -d 'Mirror a directory source\'s extended attributes (user.*, security.*, trusted.*; not ACLs), as rsync -X; archives and images always carry theirs'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -s n -l dry-run -d 'Show what would change; write nothing'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l allow-empty -d 'Allow an empty source to replace a non-empty tree'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l allow-downgrade -d 'Publish even if --label orders below the live generation\'s label'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l verify -d 'Re-read the staged tree and compare with the source hashes before publishing'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l no-fsync -d 'Flush nothing to disk, on any filesystem: no fsync or syncfs of the staged files and directories, the manifest, gen/, meta/ or the published link (faster; a crash or power loss may leave the live generation empty or missing on disk)'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l adopt -d 'With --layout fanout: take over entries packsync did not create'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l mkpath -d 'Create DEST\'s parent directories'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l migrate -d 'Take over a directory at DEST even where that leaves DEST missing for an instant'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -s i -l itemize -d 'One line per change: + added, ~ changed, - deleted (with --json, in its changes field)'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l json -d 'One JSON summary on stdout'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -s q -l quiet -d 'No summary line, no progress, warnings only'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l progress -d 'Show a progress bar (default: when stderr is a terminal; in a log, a line every 10s of long work instead, which --no-progress turns off)'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -l no-progress -d 'Show no progress bar, not even on a terminal'
complete -c packsync -n "__fish_packsync_using_subcommand sync" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "status" -d 'Show what is live and what is retained'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "verify" -d 'Re-hash the live tree against its manifest (exit 4 on differences)'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "rollback" -d 'Make a retained generation live again'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "gc" -d 'Retire old generations and remove dead staging'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "wait" -d 'Block until DEST holds a live generation (exit 5 on timeout)'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "exec" -d 'Run CMD with PACKSYNC_ROOT set to the live generation, leased while it runs'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "completions" -d 'Print a shell completion script'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "sync" -d 'Mirror SOURCE(s) into DEST (later SOURCEs win paths that several provide)'
complete -c packsync -n "__fish_packsync_using_subcommand help; and not __fish_seen_subcommand_from status verify rollback gc wait exec completions sync help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
