# bash completion for pmirrorctl(8): subcommands and options as
# daemon/pmirrorctl.cpp defines them; volume and node names from the cluster
# file ($PMIRROR_CLUSTER_FILE, else /etc/pmirror/cluster.yaml; for `config
# check|show FILE --node`, that FILE), which `pmirrorctl __complete` reads.
# Installed as share/bash-completion/completions/pmirrorctl.

_pmirrorctl_names() {  # volumes|nodes [FILE]
  local file=${2:-${PMIRROR_CLUSTER_FILE:-/etc/pmirror/cluster.yaml}}
  "${_pmirrorctl_command:-pmirrorctl}" __complete "$1" --config "$file" 2>/dev/null
}

_pmirrorctl() {
  local cur prev words cword
  _init_completion || return
  _pmirrorctl_command=${words[0]}

  local global_options='--socket --runtime-dir --timeout --help --version'
  local commands='status events resync verify promote demote reload config down up disconnect connect'

  # The subcommand: the first word that is neither an option nor the value
  # of a global option.
  local i command= command_at=0
  for ((i = 1; i < cword; i++)); do
    case ${words[i]} in
      --socket | --runtime-dir | --timeout) ((i++)) ;;
      -*) ;;
      *)
        command=${words[i]}
        command_at=$i
        break
        ;;
    esac
  done

  case $prev in
    --socket)
      _filedir
      return
      ;;
    --runtime-dir)
      _filedir -d
      return
      ;;
    --timeout | --count)
      return
      ;;
    --peer | --node | --volume)
      local file=
      if [[ $command == config && ${words[command_at + 1]} == @(check|show) ]]; then
        for ((i = command_at + 2; i < cword; i++)); do
          [[ ${words[i]} != -* && ${words[i - 1]} != --node && ${words[i - 1]} != --volume &&
            ${words[i - 1]} != --engine ]] && file=${words[i]} && break
        done
      fi
      local what=nodes
      [[ $prev == --volume ]] && what=volumes
      COMPREPLY=($(compgen -W "$(_pmirrorctl_names $what $file)" -- "$cur"))
      return
      ;;
    --engine)
      COMPREPLY=($(compgen -W 'none etcd pacemaker' -- "$cur"))
      return
      ;;
  esac

  if [[ -z $command ]]; then
    if [[ $cur == -* ]]; then
      COMPREPLY=($(compgen -W "$global_options" -- "$cur"))
    else
      COMPREPLY=($(compgen -W "$commands" -- "$cur"))
    fi
    return
  fi

  # Positional words after the subcommand so far (option values excluded).
  local positional=0
  for ((i = command_at + 1; i < cword; i++)); do
    case ${words[i]} in
      --peer | --node | --volume | --engine | --count) ((i++)) ;;
      -*) ;;
      *) ((positional++)) ;;
    esac
  done

  local options=
  case $command in
    status) options='--json --help' ;;
    events) options='--json --count --now --help' ;;
    resync) options='--peer --full --wait --json --help' ;;
    verify) options='--peer --mark-dirty --json --help' ;;
    promote) options='--force --json --help' ;;
    demote | down | up) options='--json --help' ;;
    disconnect | connect) options='--peer --json --help' ;;
    reload) options='--dry-run --json --help' ;;
    config)
      if ((positional == 0)); then
        [[ $cur == -* ]] && options='--help' || COMPREPLY=($(compgen -W 'check show' -- "$cur"))
      elif [[ ${words[command_at + 1]} == @(check|show) ]]; then
        options='--node --volume --help'
        [[ ${words[command_at + 1]} == check ]] && options+=' --engine'
        if [[ $cur != -* ]] && ((positional == 1)); then
          _filedir '@(yaml|yml)'
          return
        fi
      fi
      ;;
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$options" -- "$cur"))
    return
  fi
  case $command in
    status | resync | verify | promote | demote | down | up | disconnect | connect)
      ((positional == 0)) && COMPREPLY=($(compgen -W "$(_pmirrorctl_names volumes)" -- "$cur"))
      ;;
  esac
} &&
  complete -F _pmirrorctl pmirrorctl
